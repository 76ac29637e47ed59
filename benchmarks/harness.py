"""Benchmark of the audited harness itself: its precision (A/A), its robustness (a candidate 3%
slower must never be accepted as faster) and what the sandbox costs.

Run:  .venv/bin/python benchmarks/harness.py [--profile cpu] [--repeats 2] [--threads N]
Writes benchmarks/results/harness-<profile>.json and prints a summary. Figures depend on the
machine and on whatever else runs on it: the JSON records both (fingerprint, load averages).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from runners import measure, suite  # noqa: E402
from runners.evaluate import AuditSession, audit_candidate, run_suite  # noqa: E402
from runners.fingerprint import environment_fingerprint  # noqa: E402
from runners.sandbox import Sandbox, SandboxConfig  # noqa: E402

# A candidate exactly 3% slower than the baseline: the baseline, then a busy wait of 3% of the
# baseline's measured median (a sleep would leave the CPU idle and be timed differently).
SLOWER_TEMPLATE = '''import time
from runners.suite import {fn} as _baseline

_EXTRA_NS = {extra_ns}


def kernel(*inputs):
    out = _baseline(*inputs)
    end = time.perf_counter_ns() + _EXTRA_NS
    while time.perf_counter_ns() < end:
        pass
    return out
'''


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _half_width(ci: list[float] | None, point: float | None) -> float | None:
    if not ci or not point:
        return None
    return (ci[1] - ci[0]) / 2.0 / point


def sandbox_overhead(threads: int) -> dict[str, Any]:
    """Startup, per-candidate fork, load and round-trip costs of the sandbox."""
    spec = suite.find_spec("cpu-ci", "rmsnorm")[0]
    started = time.perf_counter()
    with Sandbox(SandboxConfig(threads=threads)) as box:
        box.start()
        zygote_s = time.perf_counter() - started
        spawns, loads, pings = [], [], []
        for _ in range(5):
            t0 = time.perf_counter()
            worker = box.spawn("candidate")
            t1 = time.perf_counter()
            worker.call("load", timeout=60, spec=spec.to_dict(), source=suite.baseline_source(spec), module="bench")
            t2 = time.perf_counter()
            for _ in range(20):
                reply = worker.call("ping", timeout=10)
                pings.append((reply.received_ns - reply.sent_ns) / 1e9)
            worker.close()
            spawns.append(t1 - t0)
            loads.append(t2 - t1)
    return {
        "zygote_start_s": zygote_s,
        "spawn_worker_s": statistics.median(spawns),
        "load_candidate_s": statistics.median(loads),
        "ping_round_trip_s": statistics.median(pings),
        "note": "spawn = fork from the zygote plus lock-down, answered by the worker's first ping",
    }


def cpu_ci_suite() -> dict[str, Any]:
    """The whole cpu-ci profile as an A/A audit: how long it takes, and that nothing is rejected."""
    load = _load()
    started = time.perf_counter()
    document = run_suite("cpu-ci")
    return {
        "wall_s": time.perf_counter() - started,
        "load_average_before": load,
        "accepted": document["summary"]["accepted"],
        "rejected": document["summary"]["rejected"],
        "errors": document["summary"]["errors"],
        "stable": document["calibration"]["stable"],
    }


def aa_runs(profile: str, protocol: measure.Protocol, repeats: int, workloads: list[str]) -> list[dict[str, Any]]:
    """The baseline audited as a candidate, `repeats` times per workload."""
    rows = []
    for repeat in range(repeats):
        load = _load()
        started = time.perf_counter()
        document = run_suite(profile, workloads=workloads, protocol=protocol)
        print(f"  A/A pass {repeat + 1}/{repeats}: {time.perf_counter() - started:.0f} s, load {load}", flush=True)
        for w in document["workloads"]:
            rows.append(
                {
                    "repeat": repeat,
                    "workload": w["key"],
                    "verdict": w["verdict"],
                    "reasons": [r["code"] for r in w["reasons"]],
                    "messages": [r["message"][:300] for r in w["reasons"]],
                    "self_speedup": w["speedup"],
                    "self_ci95": w["ci95"],
                    "self_half_width": _half_width(w["ci95"], w["speedup"]),
                    "aa_speedup": w["aa"]["speedup"],
                    "aa_ci95": w["aa"]["ci95"],
                    "aa_half_width": _half_width(w["aa"]["ci95"], w["aa"]["speedup"]),
                    "stable": w["aa"]["stable"],
                    "baseline_median_s": w["baseline"]["median_s"],
                    "preempted_share": (w.get("timing") or {}).get("preempted_share"),
                    "load_average_before_pass": load,
                }
            )
    return rows


def slower_runs(profile: str, protocol: measure.Protocol, baseline_medians: dict[str, float], threads: int) -> list[dict[str, Any]]:
    """A candidate 3% slower than the baseline: it must never come out faster with confidence."""
    rows = []
    with AuditSession(device="cpu", config=SandboxConfig(threads=threads)) as session:
        for spec in suite.profile_specs(profile):
            if spec.key not in baseline_medians:
                continue
            source = SLOWER_TEMPLATE.format(fn=suite.baseline_fn(spec).__name__, extra_ns=int(0.03 * baseline_medians[spec.key] * 1e9))
            load = _load()
            document = audit_candidate(spec.name, source, profile=profile, protocol=protocol, session=session, label="slower-3pct")
            w = next(x for x in document["workloads"] if x["key"] == spec.key)
            ci = w["ci95"]
            rows.append(
                {
                    "workload": w["key"],
                    "verdict": w["verdict"],
                    "reasons": [r["code"] for r in w["reasons"]],
                    "messages": [r["message"][:300] for r in w["reasons"]],
                    "speedup": w["speedup"],
                    "ci95": ci,
                    "false_acceptance": bool(ci and ci[0] > 1.0),
                    "ci95_rounds": w["ci95_rounds"],
                    "rounds_false_acceptance": bool(w["ci95_rounds"] and w["ci95_rounds"][0] > 1.0),
                    "billable": w["billable"],
                    "billable_false_acceptance": bool(w["billable_speedup"] and w["billable_speedup"] > 1.0),
                    "load_average_before": load,
                }
            )
            print(f"  3% slower {w['key']}: {w['verdict']} speedup {w['speedup']} ci {ci}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--repeats", type=int, default=2, help="A/A passes over the profile")
    parser.add_argument("--threads", type=int, default=None, help="override the protocol's worker threads")
    parser.add_argument("--workloads", default="", help="comma-separated subset")
    parser.add_argument("--skip-cpu-ci", action="store_true", help="do not time the cpu-ci profile")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    protocol = measure.protocol_for(args.profile)
    if args.threads is not None:
        protocol = replace(protocol, threads=args.threads)
    threads = protocol.worker_threads()
    workloads = [w for w in args.workloads.split(",") if w] or suite.workload_names()
    out = args.out or ROOT / "benchmarks" / "results" / f"harness-{args.profile}.json"
    started = time.perf_counter()
    report: dict[str, Any] = {
        "benchmark": "dyno harness",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, "benchmarks/harness.py", *(argv if argv is not None else sys.argv[1:])]),
        "profile": args.profile,
        "protocol": protocol.to_dict(),
        "worker_threads": threads,
        "environment": environment_fingerprint("cpu", threads=threads),
        "load_average_start": _load(),
    }
    print("sandbox overhead ...", flush=True)
    report["sandbox_overhead"] = sandbox_overhead(threads)
    if not args.skip_cpu_ci:
        print("cpu-ci profile (whole suite, A/A) ...", flush=True)
        report["cpu_ci_suite"] = cpu_ci_suite()
    print(f"A/A on {args.profile} x{args.repeats} ...", flush=True)
    aa = aa_runs(args.profile, protocol, args.repeats, workloads)
    medians = {}
    for row in aa:
        if row["baseline_median_s"]:
            medians.setdefault(row["workload"], []).append(row["baseline_median_s"])
    print("candidate 3% slower ...", flush=True)
    slower = slower_runs(args.profile, protocol, {k: statistics.median(v) for k, v in medians.items()}, threads)
    self_widths = [r["self_half_width"] for r in aa if r["self_half_width"] is not None]
    aa_widths = [r["aa_half_width"] for r in aa if r["aa_half_width"] is not None]
    per_workload = {}
    for row in aa:
        entry = per_workload.setdefault(row["workload"], {"aa_half_width": [], "self_half_width": [], "unstable": 0, "runs": 0})
        entry["runs"] += 1
        entry["unstable"] += row["stable"] is not True
        if row["aa_half_width"] is not None:
            entry["aa_half_width"].append(row["aa_half_width"])
        if row["self_half_width"] is not None:
            entry["self_half_width"].append(row["self_half_width"])
    report.update(
        aa_runs=aa,
        slower_runs=slower,
        per_workload={
            k: {
                "aa_half_width_median": statistics.median(v["aa_half_width"]) if v["aa_half_width"] else None,
                "self_half_width_median": statistics.median(v["self_half_width"]) if v["self_half_width"] else None,
                "unstable_share": v["unstable"] / v["runs"],
            }
            for k, v in per_workload.items()
        },
        summary={
            "median_aa_half_width": statistics.median(aa_widths) if aa_widths else None,
            "median_self_half_width": statistics.median(self_widths) if self_widths else None,
            "unstable_share": sum(r["stable"] is not True for r in aa) / len(aa) if aa else None,
            "false_rejections_of_the_baseline": sum(r["verdict"] != "accepted" for r in aa),
            "slower_false_acceptances": sum(r["false_acceptance"] for r in slower),
            "slower_false_acceptances_without_aa_widening": sum(r["rounds_false_acceptance"] for r in slower),
            "slower_billable_false_acceptances": sum(r["billable_false_acceptance"] for r in slower),
            "slower_runs": len(slower),
            "targets": {"median_aa_half_width": 0.02, "slower_false_acceptances": 0, "cpu_ci_suite_wall_s": 180},
        },
        load_average_end=_load(),
        wall_s=time.perf_counter() - started,
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({"summary": report["summary"], "sandbox_overhead": report["sandbox_overhead"], "cpu_ci_suite": report.get("cpu_ci_suite")}, indent=2))
    print(f"wrote {out} in {report['wall_s']:.0f} s; load average start {report['load_average_start']} end {report['load_average_end']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
