"""Cold and warm model optimization: the model pipeline's optimize stage (its calls, as
`pipeline.model_run.run_model_pipeline` makes them: the suite workloads planned from the model's
inventory tuned in the sandbox, then the model's strategy over eager, Dyno's patches and the
whole-model compile variants) for every sample family with an empty tuning cache, then for a second
model of the same architecture with other weights from that cache (what a second customer pays).

Run:  .venv/bin/python benchmarks/model_cache.py [--families llama,bert] [--shapes 2x64]
Writes benchmarks/results/model-cache-<profile>.json and prints a table. The estimates run at the
profile's worker thread count, as the pipeline runs them. Nothing here is audited or billed; the
end-to-end audit of the same artifacts is `model_families.py`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import transformers  # noqa: E402

from optimizer.cache import JsonlTuningCache  # noqa: E402
from optimizer.model import optimize_model  # noqa: E402
from pipeline import optimized  # noqa: E402
from runners import inventory, measure, modelplan  # noqa: E402
from runners.fingerprint import environment_fingerprint  # noqa: E402
from runners.samples import SAMPLE_FAMILIES, write_sample_model  # noqa: E402

DEFAULT_FAMILIES = ("llama", "qwen2", "mixtral", "gpt2", "bert", "mamba", "t5")


def _optimize_stage(folder: Path, cache_path: Path, *, batch: int, seq: int, profile: str, hardware: str,
                    budget_s: float) -> dict[str, Any]:
    """The pipeline's optimize stage, timed (the inventory before it is the profile stage, not timed)."""
    taken = inventory.take_inventory(folder, batch=batch, seq=seq, device="cpu", progress=lambda f, m: None)
    started = time.monotonic()
    planned, _ = modelplan.plan_workloads(taken, profile=profile, limit=6)
    _, records = optimized.tune_specs([w.spec for w in planned], device="cpu", cache_path=cache_path, budget_s=budget_s,
                                      hardware=hardware)
    tuned_s = time.monotonic() - started
    artifact = optimize_model(folder, batch=batch, seq=seq, device="cpu", cache=JsonlTuningCache(cache_path),
                              hardware=hardware, threads=measure.protocol_for(profile).worker_threads())
    return {"seconds": round(time.monotonic() - started, 3), "kernel_tuning_s": round(tuned_s, 3),
            "workloads": len(planned), "kernel_cache_hits": sum(1 for r in records if r.cache_hit),
            "strategy": artifact.strategy, "strategy_from_cache": "from_cache" in artifact.estimates,
            "optimized_modules": sum(1 for m in artifact.modules if m.status == "optimized")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default=",".join(DEFAULT_FAMILIES))
    parser.add_argument("--shapes", default="2x64", help="comma-separated BATCHxSEQ")
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--tune-budget", type=float, default=20.0, help="seconds per workload (the pipeline's default)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    families = [f for f in args.families.split(",") if f]
    unknown = [f for f in families if f not in SAMPLE_FAMILIES]
    if unknown:
        parser.error(f"unknown families {unknown}; use {sorted(SAMPLE_FAMILIES)}")
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",") if s]
    threads = measure.protocol_for(args.profile).worker_threads()
    hardware = optimized.hardware_label(environment_fingerprint("cpu"))
    out = args.out or ROOT / "benchmarks" / "results" / f"model-cache-{args.profile}.json"
    report: dict[str, Any] = {
        "benchmark": "model_cache",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": "python benchmarks/model_cache.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "profile": args.profile, "threads": threads,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "environment": environment_fingerprint(),
        "load_average_start": [round(x, 2) for x in os.getloadavg()],
        "rows": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        for family in families:
            for batch, seq in shapes:
                # A fresh cache per family and shape: the cold run searches everything, kernels included.
                cache = Path(tmp) / f"{family}-{batch}x{seq}.jsonl"
                # An empty compiler cache too: Inductor's on-disk caches would otherwise make the cold
                # run's compiles as cheap as a previous run left them.
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(Path(tmp) / f"inductor-{family}-{batch}x{seq}")
                stage = dict(batch=batch, seq=seq, profile=args.profile, hardware=hardware, budget_s=args.tune_budget)
                first = write_sample_model(Path(tmp) / f"{family}-a-{batch}x{seq}", family, seed=0)
                second = write_sample_model(Path(tmp) / f"{family}-b-{batch}x{seq}", family, seed=1)
                row = {"family": family, "batch": batch, "seq": seq,
                       "cold": _optimize_stage(first, cache, **stage), "warm": _optimize_stage(second, cache, **stage)}
                report["rows"].append(row)
                cold, warm = row["cold"], row["warm"]
                print(f"{family:8s} {batch}x{seq:<4d} cold {cold['seconds']:7.1f} s ({cold['strategy']}, "
                      f"{cold['workloads']} workloads tuned in {cold['kernel_tuning_s']:.1f} s)  warm {warm['seconds']:6.2f} s "
                      f"({warm['strategy']}, {warm['kernel_cache_hits']}/{warm['workloads']} kernel hits"
                      f"{', strategy from the cache' if warm['strategy_from_cache'] else ', strategy SEARCHED AGAIN'})",
                      flush=True)
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_text(json.dumps(report, indent=1, default=str) + "\n")  # as it goes
    report["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    out.write_text(json.dumps(report, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
