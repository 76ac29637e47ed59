"""Dyno from a customer's CI pipeline or notebook: `python -m dyno_client COMMAND`.

    python -m dyno_client upload DIR --name NAME                  # a model folder, with a progress bar
    python -m dyno_client run --model-version ID --hardware H [--wait]
    python -m dyno_client report get ID [--out DIR] [--verify]    # report, signature, keys; offline check
    python -m dyno_client usage post FILE                        # JSONL or CSV usage, 1,000 a batch

The server and key come from --url/--key or DYNO_URL/DYNO_API_KEY. Exit codes: 0 done (a run: it
succeeded; a report: it verifies), 1 the thing failed (a run failed or was cancelled; a signature
does not verify; usage events were rejected), 2 the command could not run (bad arguments, an
unreachable server, a refused request: the server's message is printed).

Standard library only, plus `cryptography` for --verify (through proof/).
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

from dyno_client.http import Api, ApiFailure
from dyno_client.progress import Bar

EXIT_OK, EXIT_FAILED, EXIT_CANNOT = 0, 1, 2
FINISHED = {"succeeded", "failed", "cancelled"}
USAGE_BATCH = 1000


def _multipart(folder: Path, name: str, boundary: str) -> tuple[list[tuple[bytes | Path, int]], int]:
    """The upload's body as pieces (bytes, or a file to stream), and its total length."""
    files = sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))
    if not files:
        raise ApiFailure(f"{folder} holds no files: upload a model folder (config.json and *.safetensors)")
    pieces: list[tuple[bytes | Path, int]] = []
    field = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"name\"\r\n\r\n{name}\r\n").encode()
    pieces.append((field, len(field)))
    for path in files:
        head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"files\"; filename=\"{path.name}\"\r\n"
                "Content-Type: application/octet-stream\r\n\r\n").encode()
        pieces += [(head, len(head)), (path, path.stat().st_size), (b"\r\n", 2)]
    tail = f"--{boundary}--\r\n".encode()
    pieces.append((tail, len(tail)))
    return pieces, sum(size for _, size in pieces)


def _stream(pieces: list[tuple[bytes | Path, int]], bar: Bar) -> Iterator[bytes]:
    for piece, size in pieces:
        if isinstance(piece, bytes):
            bar.advance(size)
            yield piece
            continue
        with open(piece, "rb") as handle:
            while chunk := handle.read(1 << 20):
                bar.advance(len(chunk))
                yield chunk


def cmd_upload(api: Api, args: argparse.Namespace) -> int:
    folder = Path(args.folder)
    if not folder.is_dir():
        raise ApiFailure(f"{folder} is not a folder")
    boundary = "dyno-" + hashlib.sha256(os.urandom(16)).hexdigest()[:24]
    pieces, total = _multipart(folder, args.name, boundary)
    bar = Bar(total, label=f"uploading {folder.name}", unit="bytes", quiet=args.quiet)
    answer = api.request("POST", "/api/v1/models", body=_stream(pieces, bar), length=total,
                         content_type=f"multipart/form-data; boundary={boundary}")
    bar.done()
    print(json.dumps({"model_version": answer.get("id"), "model": answer.get("model"),
                      "parameter_count": answer.get("parameter_count"), "kind": answer.get("kind")}))
    return EXIT_OK


def cmd_run(api: Api, args: argparse.Namespace) -> int:
    body = {"model_version": args.model_version, "hardware": args.hardware, "profile": args.profile,
            "batch": args.batch, "seq": args.seq}
    run = api.request("POST", "/api/v1/runs", json_body=body)
    print(f"run {run['id']} queued on {run['hardware']}", file=sys.stderr)
    if not args.wait:
        print(json.dumps({"run": run["id"], "status": run["status"]}))
        return EXIT_OK
    bar = Bar(1.0, label=f"run {run['id'][:8]}", unit="fraction", quiet=args.quiet)
    while run["status"] not in FINISHED:
        time.sleep(args.poll_seconds)
        run = api.request("GET", f"/api/v1/runs/{run['id']}")
        bar.set(float(run.get("progress") or 0.0), note=f"{run['status']}, {run.get('stage') or ''}")
    bar.done()
    summary = {"run": run["id"], "status": run["status"], "model": run.get("model"), "error": run.get("error")}
    print(json.dumps(summary))
    return EXIT_OK if run["status"] == "succeeded" else EXIT_FAILED


def cmd_report_get(api: Api, args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    body = api.raw("GET", f"/api/v1/reports/{args.report_id}")
    signature = api.request("GET", f"/api/v1/reports/{args.report_id}/signature")
    keys = api.request("GET", "/.well-known/dyno-report-keys.json", authenticated=False)
    (out / "report.json").write_bytes(body)
    (out / "signature.json").write_text(json.dumps(signature, indent=2) + "\n")
    (out / "keys.json").write_text(json.dumps(keys, indent=2) + "\n")
    print(f"wrote {out / 'report.json'}, signature.json, keys.json", file=sys.stderr)
    if not args.verify:
        return EXIT_OK
    from proof.signature import verify  # needs `cryptography` only

    result = verify(body, signature, keys)
    print(f"{'VALID' if result.valid else 'INVALID'} ({result.reason}): {result.message}")
    return EXIT_OK if result.valid else EXIT_FAILED


def _usage_rows(path: Path) -> list[dict[str, Any]]:
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() == ".csv":
        rows = list(csv.DictReader(io.StringIO(text)))
    else:
        rows = []
        for number, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ApiFailure(f"{path}, line {number}: not JSON ({exc.msg})") from None
    events = []
    for number, row in enumerate(rows, start=1):
        if not isinstance(row, dict) or not {"deployment", "timestamp", "gpu_hours"} <= row.keys():
            raise ApiFailure(f"{path}, event {number}: needs deployment, timestamp and gpu_hours")
        event = {"deployment": str(row["deployment"]), "timestamp": str(row["timestamp"]),
                 "gpu_hours": str(row["gpu_hours"])}
        # Derived from the content unless given: posting the same file twice bills nothing twice.
        digest = hashlib.sha256(json.dumps(event, sort_keys=True).encode()).hexdigest()[:40]
        event["idempotency_key"] = str(row.get("idempotency_key") or f"dyno-client-{digest}")
        events.append(event)
    return events


def cmd_usage_post(api: Api, args: argparse.Namespace) -> int:
    events = _usage_rows(Path(args.file))
    totals = {"created": 0, "duplicate": 0, "rejected": 0}
    rejected: list[dict[str, Any]] = []
    bar = Bar(len(events), label="usage events", unit="events", quiet=args.quiet)
    for start in range(0, len(events), args.batch_size):
        batch = events[start:start + args.batch_size]
        answer = api.request("POST", "/api/v1/usage/batch", json_body={"events": batch})
        for key in totals:
            totals[key] += int(answer.get(key, 0))
        rejected += [r for r in answer.get("results", []) if r.get("status") == "rejected"]
        bar.advance(len(batch))
    bar.done()
    print(json.dumps({**totals, "rejected_events": rejected[:20]}))
    return EXIT_FAILED if totals["rejected"] else EXIT_OK


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m dyno_client", description="Dyno's customer command line.")
    parser.add_argument("--url", default=os.environ.get("DYNO_URL", "http://127.0.0.1:8000"))
    parser.add_argument("--key", default=os.environ.get("DYNO_API_KEY", ""), help="an API key (or DYNO_API_KEY)")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    commands = parser.add_subparsers(dest="command", required=True)
    upload = commands.add_parser("upload", help="upload a model folder")
    upload.add_argument("folder")
    upload.add_argument("--name", required=True)
    upload.set_defaults(handler=cmd_upload)
    run = commands.add_parser("run", help="start a run (and wait for it)")
    run.add_argument("--model-version", required=True)
    run.add_argument("--hardware", required=True)
    run.add_argument("--profile", default="cpu-ci")
    run.add_argument("--batch", type=int, default=1)
    run.add_argument("--seq", type=int, default=32)
    run.add_argument("--wait", action="store_true", help="follow the run to its end; exit 0 only if it succeeded")
    run.add_argument("--poll-seconds", type=float, default=2.0)
    run.set_defaults(handler=cmd_run)
    report = commands.add_parser("report", help="signed reports").add_subparsers(dest="report_command", required=True)
    get = report.add_parser("get", help="download a report, its signature and the published keys")
    get.add_argument("report_id")
    get.add_argument("--out", default=".")
    get.add_argument("--verify", action="store_true", help="check the signature offline")
    get.set_defaults(handler=cmd_report_get)
    usage = commands.add_parser("usage", help="post usage").add_subparsers(dest="usage_command", required=True)
    post = usage.add_parser("post", help="post a JSONL or CSV file of usage events")
    post.add_argument("file")
    post.add_argument("--batch-size", type=int, default=USAGE_BATCH, choices=range(1, USAGE_BATCH + 1),
                      metavar=f"1..{USAGE_BATCH}")
    post.set_defaults(handler=cmd_usage_post)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not args.key:
        print("error: no API key: pass --key or set DYNO_API_KEY", file=sys.stderr)
        return EXIT_CANNOT
    try:
        return args.handler(Api(args.url, args.key), args)
    except ApiFailure as failure:
        print(f"error: {failure}", file=sys.stderr)
        return EXIT_CANNOT


if __name__ == "__main__":
    sys.exit(main())
