"""The whole-model audit's A/A control: the demo's tiny Llama, eager against eager, end to end.

The measurement issue's target: an A/A end-to-end audit of the demo sample at batch 2 x seq 64 on
the `cpu` profile is stable with a 95% half-width of at most 3% for prefill and for decode. Each
repeat is one `runners.modelaudit.audit_model_forward` with no artifact (the optimized arm runs
the unmodified model too), so both its billed comparison and its A/A control compare identical
work: every figure should be 1 within its interval.

    python benchmarks/model_aa.py [--repeats 5] [--batch 2] [--seq 64] [--out F]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from runners.modelaudit import audit_model_forward  # noqa: E402
from runners.samples import write_sample_model  # noqa: E402


def half_width(ci: list[float] | None) -> float | None:
    return (ci[1] - ci[0]) / 2 if ci else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--family", default="llama")
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "model-aa-cpu.json"))
    args = parser.parse_args()
    rows = []
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        model = write_sample_model(Path(tmp) / args.family, args.family)
        for repeat in range(args.repeats):
            t0 = time.time()
            report = audit_model_forward(model, None, batch=args.batch, seq=args.seq, device="cpu", profile=args.profile,
                                         seed=secrets.randbits(31), reference_points=())
            for phase in report["phases"]:
                aa = phase["aa"]
                row = {
                    "repeat": repeat, "phase": phase["phase"], "verdict": phase["verdict"],
                    "eager_vs_eager": phase["speedup"], "eager_vs_eager_ci95": phase["ci95"],
                    "aa": aa["speedup"], "aa_ci95": aa["ci95"], "aa_stable": aa["stable"],
                    "aa_half_width": half_width(aa["ci95"]), "rounds": phase["rounds"],
                    "calls_per_sample": phase["calls_per_sample"], "baseline_median_s": phase["baseline_median_s"],
                    "frozen_between_samples": phase.get("frozen_between_samples"),
                    "wall_s": round(time.time() - t0), "load": round(os.getloadavg()[0], 2),
                }
                rows.append(row)
                print(f"{repeat} {row['phase']:8s} A/A {row['aa']:.4f} [{aa['ci95'][0]:.4f}, {aa['ci95'][1]:.4f}] "
                      f"half-width {row['aa_half_width']:.2%} stable {row['aa_stable']}  eager/eager {row['eager_vs_eager']}",
                      flush=True)
    summary = {}
    for phase in ("prefill", "decode"):
        mine = [r for r in rows if r["phase"] == phase and r["aa_half_width"] is not None]
        if mine:
            widths = sorted(r["aa_half_width"] for r in mine)
            summary[phase] = {"runs": len(mine), "stable": sum(bool(r["aa_stable"]) for r in mine),
                              "median_half_width": widths[len(widths) // 2], "max_half_width": widths[-1],
                              "within_3pct": sum(w <= 0.03 for w in widths)}
    document = {
        "benchmark": "whole-model A/A, eager against eager (benchmarks/model_aa.py)",
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%MZ"),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
        "command": " ".join(["python", "benchmarks/model_aa.py", *sys.argv[1:]]),
        "family": args.family, "batch": args.batch, "seq": args.seq, "profile": args.profile,
        "wall_s": round(time.time() - started), "summary": summary, "rows": rows,
    }
    Path(args.out).write_text(json.dumps(document, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
