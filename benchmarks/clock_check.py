"""Benchmark of the harness's hidden-work check: how far honest candidates stay below what it
allows, and how far timer-dodging cheats land above it, on a quiet machine and under load.

Run:  .venv/bin/python benchmarks/clock_check.py [--repeats 2] [--load 2]
`--load N` keeps N busy processes running beside the audits, as a shared CI box would. Writes
benchmarks/results/clock-check-cpu-ci[-loadN].json and prints one line per audit: the verdict, the
candidate tree's CPU per sample beyond its reported time and the harness's own cost as [point, CI
low, CI high] against what is allowed, in ms, and that allowance as a share of the reported time.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from runners.evaluate import AuditSession, audit_candidate  # noqa: E402
from runners.fingerprint import environment_fingerprint  # noqa: E402
from runners.sandbox import SandboxConfig  # noqa: E402

TESTS = ROOT / "tests" / "runners"
HONEST = ["honest/rmsnorm_compiled.py", "honest/rmsnorm_alternative.py"]
CHEATS = ["cheats/patch_timer_scale.py", "cheats/patch_timer_compress.py", "cheats/deferred_commit.py",
          "cheats/adv2_hidden_budget.py"]


def _burn() -> None:
    while True:
        sum(i * i for i in range(100_000))


def _hidden(timing: dict[str, Any]) -> dict[str, Any]:
    return {
        "beyond_ms": [round(v * 1e3, 3) for v in timing.get("hidden_work_s", [])],
        "harness_ms": round(timing.get("harness_cost_s", 0.0) * 1e3, 3),
        "allowed_ms": round(timing.get("hidden_work_allowed_s", 0.0) * 1e3, 3),
        "allowed_share": round(timing.get("hidden_share_allowed", 0.0), 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--load", type=int, default=0, help="busy processes running beside the audits")
    parser.add_argument("--out", type=Path, help="default: benchmarks/results/clock-check-cpu-ci[-loadN].json")
    args = parser.parse_args()
    args.out = args.out or ROOT / "benchmarks" / "results" / (
        "clock-check-cpu-ci" + (f"-load{args.load}" if args.load else "") + ".json")
    burners = [multiprocessing.Process(target=_burn, daemon=True) for _ in range(args.load)]
    for burner in burners:
        burner.start()
    rows: list[dict[str, Any]] = []
    started = time.monotonic()
    try:
        config = SandboxConfig(device="cpu", threads=1)
        with AuditSession(device="cpu", config=config) as session:
            for repeat in range(args.repeats):
                for relative in HONEST + CHEATS:
                    source = (TESTS / relative).read_text()
                    document = audit_candidate("rmsnorm", source, profile="cpu-ci", seed=100 + repeat, session=session)
                    entry = document["workloads"][0]
                    timing = entry.get("timing") or {}
                    row = {
                        "candidate": relative,
                        "honest": relative.startswith("honest/"),
                        "repeat": repeat,
                        "verdict": document["verdict"],
                        "reasons": sorted({reason["code"] for reason in entry["reasons"]}),
                        "hidden": _hidden(timing),
                    }
                    rows.append(row)
                    hidden = row["hidden"]
                    print(f"{relative:34s} {row['verdict']:9s} hidden {hidden['beyond_ms']} / {hidden['allowed_ms']} ms"
                          f" ({hidden['allowed_share']:.1%} of the reported time)", flush=True)
    finally:
        for burner in burners:
            burner.terminate()
    honest = [r for r in rows if r["honest"]]
    cheats = [r for r in rows if not r["honest"]]
    summary = {
        "honest_rejected": sum(r["verdict"] != "accepted" for r in honest),
        "honest_audits": len(honest),
        "cheats_missed": sum(r["verdict"] == "accepted" for r in cheats),
        "honest_highest_ci_high_ms": max((r["hidden"]["beyond_ms"][2] for r in honest if r["hidden"]["beyond_ms"]), default=None),
        "cheats_lowest_ci_low_ms": min((r["hidden"]["beyond_ms"][1] for r in cheats if r["hidden"]["beyond_ms"]), default=None),
        "allowed_share_median": sorted(r["hidden"]["allowed_share"] for r in rows)[len(rows) // 2] if rows else None,
        "cheat_audits": len(cheats),
    }
    result = {
        "benchmark": "clock-check",
        "profile": "cpu-ci",
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["benchmarks/clock_check.py", *sys.argv[1:]]),
        "load_processes": args.load,
        "load_average": os.getloadavg(),
        "seconds": round(time.monotonic() - started, 1),
        "environment": environment_fingerprint("cpu"),
        "summary": summary,
        "audits": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
