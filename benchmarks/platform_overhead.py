"""End-to-end model run on a real Celery worker, and the platform's share of its wall time.

Starts a web server (the control API) and a runner worker without database credentials
(DYNO_ROLE=runner, a runner key) beside a control worker, on the configured broker and database,
uploads a small real model, runs it on `cpu` with the `cpu-ci` profile, and writes
benchmarks/results/platform-overhead.json: wall time from queueing to succeeded, the pipeline's own
measured work (profile + optimize + audit), and the rest (queueing, claiming, fetching the model,
progress reports, storing) as the overhead.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/dyno_bench CELERY_BROKER_URL=redis://127.0.0.1:6379/13 \\
        .venv/bin/python benchmarks/platform_overhead.py [--runs 2] [--family llama]
"""

from __future__ import annotations

import argparse
import json
import os
import platform as stdlib_platform
import socket
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "platform"), str(ROOT)]
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dyno.settings")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2, help="model runs; the first warms the tuning cache")
    parser.add_argument("--family", default="llama")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "platform-overhead.json"))
    args = parser.parse_args()

    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from accounts.selectors import Actor
    from accounts.services import organization_create
    from catalog.services import NamedUpload, model_version_upload
    from django.core.files.uploadedfile import SimpleUploadedFile
    from runners.samples import write_sample_model
    from runs.models import Run
    from runs.services import run_start

    work = Path(tempfile.mkdtemp(prefix="dyno-bench-"))
    env = dict(os.environ, DYNO_MEDIA_ROOT=str(work / "media"), DYNO_TUNING_CACHE=str(work / "tuning.jsonl"),
               PYTHONUNBUFFERED="1")
    os.environ.update({k: env[k] for k in ("DYNO_MEDIA_ROOT", "DYNO_TUNING_CACHE")})
    from django.conf import settings

    settings.MEDIA_ROOT = work / "media"
    from fleet.keys import runner_key_create

    _, token = runner_key_create(name=f"bench-{os.getpid()}", hardware=["cpu"])
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    processes = [subprocess.Popen(
        [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"], cwd=ROOT, env=env,
        stdout=open(work / "web.log", "w"), stderr=subprocess.STDOUT, start_new_session=True)]
    runner_env = {k: v for k, v in env.items() if k != "DATABASE_URL"}
    runner_env.update(DYNO_ROLE="runner", DYNO_CONTROL_URL=f"http://127.0.0.1:{port}", DYNO_RUNNER_TOKEN=token,
                      DYNO_RUNNER_CALIBRATION="off", DYNO_RUNNER_CACHE=str(work / "runner-cache"))
    for queue, role_env in (("control", env), ("cpu", runner_env)):
        processes.append(subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "dyno", "worker", "-Q", queue, "-c", "1",
             "-n", f"bench-{queue}-{os.getpid()}@%h", "--without-gossip", "--without-mingle", "-l", "warning"],
            cwd=ROOT / "platform", env=role_env, stdout=open(work / f"worker-{queue}.log", "w"),
            stderr=subprocess.STDOUT, start_new_session=True))
    try:
        org = organization_create(slug=f"bench-{os.getpid()}", name="Bench")
        actor = Actor(roles={org.pk: "owner"})
        folder = write_sample_model(work / "model", args.family)
        uploads = [NamedUpload(path=p.name, file=SimpleUploadedFile(p.name, p.read_bytes()))
                   for p in sorted(folder.iterdir())]
        version = model_version_upload(actor=actor, organization=org, model_name="bench", uploads=uploads)
        rows = []
        for index in range(args.runs):
            run = run_start(actor=actor, version=version, hardware="cpu", profile="cpu-ci", batch=1, seq=64)
            while not Run.objects.get(pk=run.pk).finished:
                time.sleep(0.5)
            run.refresh_from_db()
            if run.status != "succeeded":
                print(f"run {index} {run.status}: {run.error}", file=sys.stderr)
                return 1
            wall = (run.finished_at - run.created_at).total_seconds()
            queued = (run.started_at - run.created_at).total_seconds()
            work_s = sum(run.result["optimization"]["seconds"].values())
            rows.append({"run": index, "wall_s": wall, "queue_s": queued, "measured_work_s": work_s,
                         "overhead_s": wall - work_s, "overhead_share": (wall - work_s) / wall,
                         "model_speedup": run.model_speedup, "model_ci95": [run.model_ci_low, run.model_ci_high],
                         "cache_hits": sum(t["cache_hit"] for t in run.result["optimization"]["tuning"]),
                         "stage_seconds": run.result["optimization"]["seconds"]})
            print(json.dumps(rows[-1]))
    finally:
        for process in processes:
            process.terminate()
            process.wait(timeout=30)
    document = {
        "benchmark": "platform-overhead", "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{stdlib_platform.node()} {os.cpu_count()} cores, load {os.getloadavg()}",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "model": f"runners.samples {args.family} (tiny)", "profile": "cpu-ci",
        "roles": "runner worker without database credentials (control API over HTTP) + control worker + runserver",
        "runs": rows,
    }
    Path(args.out).write_text(json.dumps(document, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
