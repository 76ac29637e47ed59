"""Honest candidates against their baselines in a plain loop, outside the harness: one process, one
thread, 64 distinct input sets per workload (`cpu-ci` shapes), each function warmed, then the median
of 7 passes. No sandbox, no stepping, no fence: the figure the audited speedups of
`benchmarks/honest_speedups.py` are compared with (docs/figures.md).

    python benchmarks/back_to_back.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from runners import suite  # noqa: E402

HONEST = ROOT / "tests" / "runners" / "honest"
PAIRS = [("rmsnorm", "rmsnorm_alternative.py"), ("softmax", "softmax_alternative.py"), ("gemm", "gemm_einsum.py"),
         ("attention_prefill", "attention_prefill_manual.py"), ("moe", "moe_dense.py"), ("ssm_scan", "ssm_scan_logspace.py")]


def _kernel_from(source: str, name: str):
    namespace: dict = {"__name__": name}
    exec(compile(source, name, "exec"), namespace)  # noqa: S102 - the project's own honest candidates
    return namespace["kernel"]


def _per_call(fn, sets) -> float:
    for args in sets[:8]:
        fn(*args)
    passes = []
    for _ in range(7):
        start = time.perf_counter()
        for args in sets:
            fn(*args)
        passes.append((time.perf_counter() - start) / len(sets))
    return statistics.median(passes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="cpu-ci")
    args = parser.parse_args()
    torch.set_num_threads(1)
    for workload, filename in PAIRS:
        spec = suite.find_spec(args.profile, workload)[0]
        baseline = _kernel_from(suite.baseline_source(spec), "baseline")
        candidate = _kernel_from((HONEST / filename).read_text(), filename)
        layouts = suite.input_layouts(spec)
        sets = [tuple(suite.generate_tensor(layout, tuple(layout.shape) if layout.shape else (1,), seed=64 * i + j,
                                            dtype=spec.torch_dtype, device="cpu", distribution="normal").reshape(layout.shape)
                      for j, layout in enumerate(layouts)) for i in range(64)]
        first, theirs, again = _per_call(baseline, sets), _per_call(candidate, sets), _per_call(baseline, sets)
        print(f"{filename:30s} baseline {first * 1e6:8.1f} us  candidate {theirs * 1e6:8.1f} us  "
              f"speedup {first / theirs:.3f} (baseline again: {again / theirs:.3f})", flush=True)


if __name__ == "__main__":
    main()
