"""Benchmark of usage ingestion through the real HTTP API: gunicorn started on a loopback port,
several client threads posting prepared batches of 1,000 events to POST /api/v1/usage/batch with
keep-alive connections, against PostgreSQL on the same box. Every event must come back created.

Run: .venv/bin/python benchmarks/metering_ingest.py [--events 300000] [--workers 4] [--clients 8]
Writes benchmarks/results/metering-ingest.json.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import queue
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from metering_setup import ROOT, django_setup, drop_database, machine, make_customers, prepare_database, write_result  # noqa: E402,E501

DATABASE = "dyno_metering_bench_ingest"
BATCH = 1000


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_server(url: str, port: int, workers: int) -> subprocess.Popen:
    env = {**os.environ, "DATABASE_URL": url, "DYNO_DEBUG": "False", "DYNO_LOG_LEVEL": "WARNING",
           "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'platform'}"}
    server = subprocess.Popen([str(Path(sys.executable).parent / "gunicorn"), "dyno.wsgi:application", "--chdir",
                               str(ROOT / "platform"), "--bind", f"127.0.0.1:{port}", "--workers", str(workers),
                               "--log-level", "warning", "--keep-alive", "30"], env=env, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            connection.request("GET", "/api/v1/openapi.json")
            if connection.getresponse().status == 200:
                return server
        except OSError:
            time.sleep(0.2)
    server.kill()
    raise SystemExit("gunicorn did not answer within 60 s")


def batches(deployments: list[str], count: int) -> list[bytes]:
    """Prepared request bodies: unique keys, times in the last day, hours as decimal strings."""
    now = datetime.now(UTC) - timedelta(hours=1)
    bodies = []
    for b in range(count):
        events = [{"idempotency_key": f"{b}-{i}-{uuid.uuid4().hex[:8]}", "deployment": deployments[(b + i) % len(deployments)],
                   "timestamp": (now - timedelta(seconds=b * BATCH + i)).isoformat(),
                   "gpu_hours": f"{(i % 97 + 1) / 64:.6f}"} for i in range(BATCH)]
        bodies.append(json.dumps({"events": events}).encode())
    return bodies


def post_all(port: int, key: str, bodies: list[bytes], clients: int) -> tuple[float, list[float], int]:
    work: queue.SimpleQueue[bytes] = queue.SimpleQueue()
    for body in bodies:
        work.put(body)
    latencies: list[float] = []
    failures: list[str] = []
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}

    def client() -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        while True:
            try:
                body = work.get_nowait()
            except queue.Empty:
                return
            began = time.monotonic()
            connection.request("POST", "/api/v1/usage/batch", body=body, headers=headers)
            response = connection.getresponse()
            payload = response.read()
            latencies.append(time.monotonic() - began)
            if response.status != 200 or not payload.startswith(b'{"created": 1000,'):
                failures.append(f"{response.status} {payload[:200]!r}")

    threads = [threading.Thread(target=client) for _ in range(clients)]
    began = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - began
    if failures:
        raise SystemExit(f"{len(failures)} batches failed, first: {failures[0]}")
    return elapsed, latencies, len(bodies) * BATCH


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=300_000, help="events in the timed phase (multiple of 1000)")
    parser.add_argument("--workers", type=int, default=4, help="gunicorn sync workers")
    parser.add_argument("--clients", type=int, default=8, help="client threads, each with a keep-alive connection")
    parser.add_argument("--deployments", type=int, default=20)
    parser.add_argument("--keep", action="store_true", help="keep the benchmark database afterwards")
    args = parser.parse_args()

    url = prepare_database(DATABASE)
    django_setup(url)
    from accounts.services import api_key_create
    from metering.models import UsageEvent

    today = date.today()
    deployments = make_customers(organizations=1, deployments_per_org=args.deployments,
                                 contract_from=(today.replace(day=1) - timedelta(days=40)).replace(day=1),
                                 active_from=datetime.now(UTC) - timedelta(days=30))
    organization = deployments[0].organization
    _, key = api_key_create(organization=organization, scope="customer", name="benchmark")
    ids = [str(d.pk) for d in deployments]
    warmup = batches(ids, args.workers * 4)
    timed = batches(ids, args.events // BATCH)

    port = free_port()
    server = start_server(url, port, args.workers)
    try:
        post_all(port, key, warmup, args.clients)  # imports, connections and caches warm in every worker
        elapsed, latencies, events = post_all(port, key, timed, args.clients)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    stored = UsageEvent.objects.filter(organization=organization).count()
    assert stored == events + len(warmup) * BATCH, f"{stored} events stored"
    latencies.sort()
    result = {
        "benchmark": "metering usage ingestion over HTTP",
        "command": " ".join(["benchmarks/metering_ingest.py", *sys.argv[1:]]),
        "events": events, "batch_size": BATCH, "gunicorn_workers": args.workers, "client_threads": args.clients,
        "seconds": round(elapsed, 2), "events_per_second": round(events / elapsed),
        "batch_latency_ms": {"p50": round(statistics.median(latencies) * 1000, 1),
                             "p95": round(latencies[int(len(latencies) * 0.95) - 1] * 1000, 1),
                             "max": round(latencies[-1] * 1000, 1)},
        "target": "at least 20,000 events per second sustained", "machine": machine(),
    }
    path = write_result("ingest", result)
    print(f"{events:,} events in {elapsed:.1f} s: {result['events_per_second']:,} events/s "
          f"(batch p50 {result['batch_latency_ms']['p50']} ms, p95 {result['batch_latency_ms']['p95']} ms; "
          f"{args.workers} gunicorn workers, {args.clients} client threads)")
    print(f"written to {path}")
    if not args.keep:
        drop_database(DATABASE)


if __name__ == "__main__":
    main()
