"""Command line of the optimizer: tune suite workloads through the runner's evaluator, or build a
model's optimization artifact.

  python -m optimizer tune --workload rmsnorm --profile cpu [--cache FILE] [--json OUT]
  python -m optimizer optimize-model --model DIR --batch 1 --seq 128 --out artifact.json
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from pathlib import Path
from typing import Any

# Compile worker processes only add noise to timings on small CPU runners.
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

DEFAULT_EVALUATOR = "pipeline.evaluator:SandboxEvaluator"
DEFAULT_SUITE = "runners.suite"


class UsageError(Exception):
    """A mistake on the command line; the message says what to change."""


def load_dotted(path: str) -> Any:
    """'package.module:Attribute' (or 'package.module' alone) -> the object, imported at run time so
    the optimizer never depends on the runner statically."""
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(f"cannot import {module_name!r} for {path!r} ({exc}); run from the repository root "
                         "or pass another dotted path") from exc
    if not attr:
        return module
    try:
        return getattr(module, attr)
    except AttributeError:
        raise UsageError(f"{module_name!r} has no attribute {attr!r}") from None


def _tune(args: argparse.Namespace) -> int:
    from optimizer.cache import JsonlTuningCache
    from optimizer.search import tune_workload

    suite = load_dotted(args.suite)
    evaluator_cls = load_dotted(args.evaluator)
    specs = [s for s in suite.profile_specs(args.profile) if args.workload in ("all", s.name)]
    if not specs:
        names = sorted({s.name for s in suite.profile_specs(args.profile)})
        raise UsageError(f"profile {args.profile!r} has no workload {args.workload!r}; choose one of {names} or 'all'")
    device = args.device or (suite.profile_device(args.profile) if hasattr(suite, "profile_device") else "cpu")
    cache = JsonlTuningCache(args.cache) if args.cache else None
    results = []
    for spec in specs:
        evaluator = evaluator_cls(spec, device=device)
        result = tune_workload(spec.name, spec.family, dict(spec.shape), spec.dtype, evaluator, device=device,
                               cache=cache, time_budget_s=args.budget, hardware=args.hardware)
        speed = f"x{result.speedup_estimate:.2f}" if result.speedup_estimate else "n/a"
        print(f"{spec.name} {dict(spec.shape)} {spec.dtype}: {result.chosen.name} ({speed} estimated, "
              f"{result.strategy}, {len(result.trials)} trials, {result.seconds_spent:.1f}s"
              f"{', cache hit' if result.cache_hit else ''})")
        results.append(result.to_dict())
    if args.json:
        Path(args.json).write_text(json.dumps({"schema": "dyno.tuning-run/1", "profile": args.profile,
                                               "device": device, "results": results}, indent=2) + "\n")
    return 0


def _optimize_model(args: argparse.Namespace) -> int:
    from optimizer.cache import JsonlTuningCache
    from optimizer.model import Status, optimize_model

    if not (Path(args.model) / "config.json").is_file():
        raise UsageError(f"{args.model} has no config.json; pass a Hugging Face model folder")
    if args.batch < 1 or args.seq < 1:
        raise UsageError("--batch and --seq must be positive")
    artifact = optimize_model(args.model, batch=args.batch, seq=args.seq, device=args.device,
                              cache=JsonlTuningCache(args.cache) if args.cache else None,
                              hardware=args.hardware, try_compile=not args.no_compile)
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

    tune = sub.add_parser("tune", help="tune suite workloads with the runner's evaluator")
    tune.add_argument("--workload", required=True, help="a suite workload name, or 'all'")
    tune.add_argument("--profile", required=True, help="suite profile, e.g. cpu-ci, cpu, gpu")
    tune.add_argument("--cache", help="tuning cache file (JSON lines); warm entries skip the search")
    tune.add_argument("--json", help="write the tuning results (every trial) here")
    tune.add_argument("--budget", type=float, default=60.0, help="search seconds per workload (default 60)")
    tune.add_argument("--device", help="device to tune for (default: the profile's)")
    tune.add_argument("--hardware", help="hardware fingerprint for the cache key (default: a local one)")
    tune.add_argument("--evaluator", default=DEFAULT_EVALUATOR,
                      help=f"evaluator class as module:Class, built as Class(spec, device=...) (default {DEFAULT_EVALUATOR})")
    tune.add_argument("--suite", default=DEFAULT_SUITE, help=f"suite module with profile_specs() (default {DEFAULT_SUITE})")
    tune.set_defaults(run=_tune)

    opt = sub.add_parser("optimize-model", help="map a model's modules to tuned kernels and write the artifact")
    opt.add_argument("--model", required=True, help="Hugging Face model folder (config.json + *.safetensors)")
    opt.add_argument("--batch", type=int, required=True)
    opt.add_argument("--seq", type=int, required=True)
    opt.add_argument("--out", required=True, help="artifact JSON to write")
    opt.add_argument("--device", default="cpu")
    opt.add_argument("--cache", help="tuning cache file to take per-workload choices from")
    opt.add_argument("--hardware", help="hardware fingerprint matching the cache's entries")
    opt.add_argument("--no-compile", action="store_true", help="skip the whole-model torch.compile candidate")
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
