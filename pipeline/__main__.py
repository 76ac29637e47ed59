"""Command line: `python -m pipeline suite` tunes every workload of a profile with Dyno's optimizer
(tuning cache first), then has the harness audit what it chose, exactly as `python -m runners suite
--candidates DIR` audits a directory of someone else's kernels. `python -m pipeline tune` runs the
search alone (every candidate graded by the harness's evaluator) and prints what it would choose.

Exit codes: 0 nothing rejected or errored, 1 something rejected or errored (JSON still written),
2 the command could not run (message on stderr).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, Sequence

from runners.cli import EXIT_ACCEPTED, EXIT_REJECTED, Parser
from runners.cli import fail as _fail
from runners.cli import progress_lines as _progress
from runners.cli import selection, write_json

# Relative to the current directory: the platform's own default when run from the repository root.
DEFAULT_TUNING_CACHE = "var/tuning-cache.jsonl"
DEFAULT_TUNE_BUDGET_S = 20.0


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: the budget must be a positive number of seconds")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = Parser(prog="python -m pipeline", description="Dyno's optimizer, judged by the audited harness.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    tuned = commands.add_parser("suite", help="tune each workload of a profile with Dyno's optimizer, then audit its picks")
    tuned.add_argument("--profile", required=True, help="cpu-ci, cpu or gpu")
    tuned.add_argument("--json", required=True, type=Path, help="where to write the result JSON")
    tuned.add_argument("--workloads", default="", help="comma-separated subset (default: all)")
    tuned.add_argument("--device", default=None, help="cpu or cuda[:N]; default: the profile's device")
    tuned.add_argument("--seed", type=int, default=None, help="fix the audit's input seeds (default: fresh random)")
    tuned.add_argument("--reference-points", default="torch-compile",
                       help="comma-separated reference points timed beside the baseline (default: torch-compile, "
                       "what a customer gets for free; '' for none)")
    tuned.add_argument("--tuning-cache", type=Path, default=None, metavar="PATH",
                       help=f"the JSON-lines tuning cache (default: $DYNO_TUNING_CACHE or {DEFAULT_TUNING_CACHE})")
    tuned.add_argument("--tune-budget", type=_positive_seconds, default=None, metavar="SECONDS",
                       help=f"search time per workload on a cache miss (default: $DYNO_TUNE_BUDGET_SECONDS or {DEFAULT_TUNE_BUDGET_S:g})")
    tuned.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    tune = commands.add_parser("tune", help="search kernels for suite workloads, each candidate graded by the harness's sandboxed evaluator")
    tune.add_argument("--workload", required=True, help="a suite workload name, or 'all'")
    tune.add_argument("--profile", required=True, help="cpu-ci, cpu or gpu")
    tune.add_argument("--cache", type=Path, help="tuning cache file (JSON lines); warm entries skip the search")
    tune.add_argument("--json", type=Path, help="write the tuning results (every trial) here")
    tune.add_argument("--budget", type=_positive_seconds, default=60.0, help="search seconds per workload (default 60)")
    tune.add_argument("--device", help="device to tune for (default: the profile's)")
    tune.add_argument("--hardware", help="hardware fingerprint for the cache key (default: a local one)")
    return parser


def _tune(args: argparse.Namespace) -> int:
    """The optimizer's search, graded by the harness's evaluator (a quick sandboxed audit per
    candidate): estimates to choose with, not audited figures (`suite` audits what it chose)."""
    from optimizer.cache import JsonlTuningCache
    from optimizer.search import tune_workload
    from pipeline import evaluator
    from runners import suite

    if args.profile not in suite.profile_names():
        return _fail(f"unknown profile {args.profile!r}; use one of {', '.join(suite.profile_names())}")
    specs = [s for s in suite.profile_specs(args.profile) if args.workload in ("all", s.name)]
    if not specs:
        names = sorted({s.name for s in suite.profile_specs(args.profile)})
        return _fail(f"profile {args.profile!r} has no workload {args.workload!r}; choose one of {names} or 'all'")
    device = args.device or suite.profile_device(args.profile)
    cache = JsonlTuningCache(args.cache) if args.cache else None
    results = []
    for spec in specs:
        result = tune_workload(spec.name, spec.family, dict(spec.shape), spec.dtype, evaluator.SandboxEvaluator(spec, device=device),
                               device=device, cache=cache, time_budget_s=args.budget, hardware=args.hardware)
        speed = f"x{result.speedup_estimate:.2f}" if result.speedup_estimate else "n/a"
        print(f"{spec.name} {dict(spec.shape)} {spec.dtype}: {result.chosen.name} ({speed} estimated, "
              f"{result.strategy}, {len(result.trials)} trials, {result.seconds_spent:.1f}s"
              f"{', cache hit' if result.cache_hit else ''})")
        results.append(result.to_dict())
    if args.json:
        write_json(args.json, {"schema": "dyno.tuning-run/1", "profile": args.profile, "device": device, "results": results})
    return EXIT_ACCEPTED


def _tuning_table(optimization: dict[str, Any]) -> str:
    """What the optimizer chose per workload and what choosing cost, under the audit's table."""
    lines = [f"optimizer (budget {optimization['budget_s']:g} s per workload, cache {optimization['tuning_cache']}):"]
    for record in optimization["tuning"]:
        how = "cache hit" if record["cache_hit"] else f"{record['trials']} trials, {record['seconds']:.1f} s"
        lines.append(f"  {record['key']}: {record['candidate']} ({how})")
    seconds = optimization["seconds"]
    lines.append(f"tuning {seconds['tune']:.1f} s, audit {seconds['audit']:.1f} s")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    if args.command == "tune":
        return _tune(args)
    from pipeline.optimized import run_optimized_suite
    from runners.evaluate import HarnessError
    from runners.result import render_table

    names, problem = selection(args.profile, args.workloads)
    if problem:
        return _fail(problem)
    cache_path = args.tuning_cache or Path(os.environ.get("DYNO_TUNING_CACHE") or DEFAULT_TUNING_CACHE)
    try:
        budget_s = args.tune_budget or _positive_seconds(os.environ.get("DYNO_TUNE_BUDGET_SECONDS") or str(DEFAULT_TUNE_BUDGET_S))
    except argparse.ArgumentTypeError as exc:
        return _fail(f"DYNO_TUNE_BUDGET_SECONDS {exc}")
    try:  # fail now, not after minutes of tuning
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        cache_path.open("a").close()
    except OSError as exc:
        return _fail(f"cannot use tuning cache {cache_path}: {exc.strerror}")
    try:
        document = run_optimized_suite(
            args.profile, workloads=names or None, device=args.device, cache_path=cache_path, budget_s=budget_s,
            seed=args.seed, reference_points=[p for p in args.reference_points.split(",") if p],
            progress=_progress(args.quiet),
        )
    except (HarnessError, ValueError) as exc:
        return _fail(str(exc))
    write_json(args.json, document)
    print(render_table(document))
    print("\n" + _tuning_table(document["optimization"]))
    print(f"\nwrote {args.json}")
    ok = document["summary"]["rejected"] == 0 and document["summary"]["errors"] == 0
    return EXIT_ACCEPTED if ok else EXIT_REJECTED


if __name__ == "__main__":
    sys.exit(main())
