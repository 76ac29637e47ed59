"""Command line of the optimizer: build a model's optimization artifact with the optimizer's own
quick timings (a proposal; the harness measures it: `python -m runners model-audit`).

  python -m optimizer optimize-model --model DIR --batch 1 --seq 128 --out artifact.json

Searching kernels for suite workloads needs a grader, which the optimizer never picks for itself:
`python -m pipeline tune` runs the search with the harness's sandboxed evaluator.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

# Compile worker processes only add noise to timings on small CPU runners.
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")


class UsageError(Exception):
    """A mistake on the command line; the message says what to change."""


def _optimize_model(args: argparse.Namespace) -> int:
    from optimizer.cache import JsonlTuningCache
    from optimizer.model import Status, compile_variants, optimize_model

    if not (Path(args.model) / "config.json").is_file():
        raise UsageError(f"{args.model} has no config.json; pass a Hugging Face model folder")
    if args.batch < 1 or args.seq < 1:
        raise UsageError("--batch and --seq must be positive")
    variants = [v.strip() for v in (args.variants or "").split(",") if v.strip()] or None
    try:
        compile_variants(variants)
    except ValueError as exc:
        raise UsageError(f"--variants: {exc}") from None
    artifact = optimize_model(args.model, batch=args.batch, seq=args.seq, device=args.device,
                              cache=JsonlTuningCache(args.cache) if args.cache else None,
                              hardware=args.hardware, try_compile=not args.no_compile,
                              variants=variants)
    artifact.save(args.out)
    counts: dict[str, int] = {}
    for m in artifact.modules:
        counts[m.status] = counts.get(m.status, 0) + 1
    print(f"{artifact.model['architecture']}: strategy {artifact.strategy}; modules "
          f"{counts.get(Status.OPTIMIZED, 0)} optimized, {counts.get(Status.BASELINE, 0)} baseline kept, "
          f"{counts.get(Status.FALLBACK, 0)} fallback; wrote {args.out}")
    for note in artifact.notes:
        print(f"note: {note}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m optimizer", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    opt = sub.add_parser("optimize-model", help="map a model's modules to tuned kernels and write the artifact")
    opt.add_argument("--model", required=True, help="Hugging Face model folder (config.json + *.safetensors)")
    opt.add_argument("--batch", type=int, required=True)
    opt.add_argument("--seq", type=int, required=True)
    opt.add_argument("--out", required=True, help="artifact JSON to write")
    opt.add_argument("--device", default="cpu")
    opt.add_argument("--cache", help="tuning cache file to take per-workload choices from")
    opt.add_argument("--hardware", help="hardware fingerprint matching the cache's entries")
    opt.add_argument("--no-compile", action="store_true", help="skip the whole-model torch.compile candidate")
    opt.add_argument("--variants", help="comma-separated whole-model compile variants to try (default: all)")
    opt.set_defaults(run=_optimize_model)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
