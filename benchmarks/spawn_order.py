"""Does a trusted worker's place in the spawn order bias the A/A control? (the measurement issue)

On the AMD EPYC VM of 2026-12-05 swiglu's A/A read 1.03-1.15 in every harness pass: the baseline
worker (spawned, bound and loaded first) slower than the A/A worker, and than the baseline run as
a candidate (spawned last). This audits one workload's baseline against itself on the `cpu`
profile (`runners.evaluate.run_suite`, no candidate), alternating the plain order with one where
the first-spawned trusted worker serves as the A/A control instead of the baseline
(AuditSession.baselines returns its workers reversed): if the order made the bias, the A/A would
flip below 1 in the swapped runs.

    python benchmarks/spawn_order.py [--workload swiglu] [--pairs 3]   (one line per run)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def one(mode: str, workload: str) -> None:
    sys.path.insert(0, str(ROOT))
    from runners.audit import session
    from runners.evaluate import run_suite

    if mode == "swap":
        plain = session.AuditSession.baselines

        def baselines(self, spec, count, protocol, inputs):
            return plain(self, spec, count, protocol, inputs)[::-1]

        session.AuditSession.baselines = baselines
    w = run_suite("cpu", workloads=[workload])["workloads"][0]
    aa = w.get("aa") or {}
    print(json.dumps({"order": mode, "workload": workload, "self": w.get("speedup"), "self_ci_rounds": w.get("ci95_rounds"),
                      "aa": aa.get("speedup"), "aa_ci": aa.get("ci95"), "verdict": w.get("verdict")}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="swiglu")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--one", choices=("plain", "swap"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        one(args.one, args.workload)
        return
    for _ in range(args.pairs):  # each run in a fresh process, as a runner's suite is
        for mode in ("plain", "swap"):
            subprocess.run([sys.executable, __file__, "--one", mode, "--workload", args.workload], check=True,
                           env={**os.environ, "DYNO_ENV": os.environ.get("DYNO_ENV", "development")},
                           stderr=subprocess.DEVNULL)


if __name__ == "__main__":
    main()
