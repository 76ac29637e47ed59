"""Command line: `python -m runners audit|suite` print a table and write dyno.suite-result/1 JSON.

`suite --optimized` first tunes every workload with Dyno's optimizer (tuning cache first), then
audits what it chose exactly as it audits a `--candidates` directory.

Exit codes: 0 accepted (suite: nothing rejected or errored), 1 rejected or errored (JSON still
written), 2 the audit could not run (bad arguments, unknown workload; message on stderr).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Sequence

EXIT_ACCEPTED, EXIT_REJECTED, EXIT_CANNOT_RUN = 0, 1, 2
# Relative to the current directory: the platform's own default when run from the repository root.
DEFAULT_TUNING_CACHE = "var/tuning-cache.jsonl"
DEFAULT_TUNE_BUDGET_S = 20.0


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse exits 2 too; keep the message readable
        self.print_usage(sys.stderr)
        raise SystemExit(_fail(f"{message} (see --help)"))


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return EXIT_CANNOT_RUN


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m runners", description="Dyno's audited benchmark harness (suite v1).")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def common(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("--profile", required=True, help="cpu-ci, cpu or gpu")
        sub.add_argument("--json", required=True, type=Path, help="where to write the result JSON")
        sub.add_argument("--device", default=None, help="cpu or cuda[:N]; default: the profile's device")
        sub.add_argument("--seed", type=int, default=None, help="fix the input seeds (default: fresh random)")
        sub.add_argument(
            "--reference-points",
            default=None,
            help="comma-separated reference points to time beside the baseline (torch-compile); "
            "default: none, or torch-compile with --optimized",
        )
        sub.add_argument("--quiet", action="store_true", help="no progress lines on stderr")

    audit = commands.add_parser("audit", help="audit one candidate module for one workload")
    audit.add_argument("--workload", required=True)
    audit.add_argument("--candidate", required=True, type=Path, help="a Python file defining kernel(*inputs)")
    common(audit)
    suite_cmd = commands.add_parser("suite", help="baseline vs candidate for every workload of a profile")
    suite_cmd.add_argument("--workloads", default="", help="comma-separated subset (default: all)")
    chosen_by = suite_cmd.add_mutually_exclusive_group()
    chosen_by.add_argument("--candidates", type=Path, default=None, help="directory holding NAME.py per workload")
    chosen_by.add_argument(
        "--optimized", action="store_true", help="tune each workload with Dyno's optimizer (tuning cache first), then audit its picks"
    )
    suite_cmd.add_argument(
        "--tuning-cache",
        type=Path,
        default=None,
        metavar="PATH",
        help=f"with --optimized: the JSON-lines tuning cache (default: $DYNO_TUNING_CACHE or {DEFAULT_TUNING_CACHE})",
    )
    suite_cmd.add_argument(
        "--tune-budget",
        type=_positive_seconds,
        default=None,
        metavar="SECONDS",
        help=f"with --optimized: search time per workload on a cache miss (default: $DYNO_TUNE_BUDGET_SECONDS or {DEFAULT_TUNE_BUDGET_S:g})",
    )
    common(suite_cmd)
    return parser


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: the budget must be a positive number of seconds")
    return value


def _progress(quiet: bool) -> Any:
    if quiet:
        return None

    def report(fraction: float, message: str) -> None:
        print(f"[{fraction:6.1%}] {message}", file=sys.stderr, flush=True)

    return report


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
    from runners import suite
    from runners.evaluate import HarnessError, audit_candidate, run_suite
    from runners.result import render_table

    if args.profile not in suite.profile_names():
        return _fail(f"unknown profile {args.profile!r}; use one of {', '.join(suite.profile_names())}")
    optimized = getattr(args, "optimized", False)
    if optimized:
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
    elif getattr(args, "tuning_cache", None) or getattr(args, "tune_budget", None):
        return _fail("--tuning-cache and --tune-budget only apply with --optimized")
    if args.reference_points is None:  # an optimized run is judged against what torch.compile gives for free
        args.reference_points = "torch-compile" if optimized else ""
    points = [p for p in args.reference_points.split(",") if p]
    try:
        if args.command == "audit":
            if args.workload not in suite.workload_names():
                return _fail(f"unknown workload {args.workload!r}; use one of {', '.join(suite.workload_names())}")
            try:
                source = args.candidate.read_text()
            except OSError as exc:
                return _fail(f"cannot read candidate {args.candidate}: {exc.strerror}")
            document = audit_candidate(
                args.workload,
                source,
                profile=args.profile,
                device=args.device,
                seed=args.seed,
                progress=_progress(args.quiet),
                reference_points=points,
                label=args.candidate.name,
            )
            ok = document["verdict"] == "accepted"
        else:
            names = [n for n in args.workloads.split(",") if n]
            unknown = [n for n in names if n not in suite.workload_names()]
            if unknown:
                return _fail(f"unknown workload(s) {', '.join(unknown)}; use {', '.join(suite.workload_names())}")
            if optimized:
                from runners.optimized import run_optimized_suite

                document = run_optimized_suite(
                    args.profile,
                    workloads=names or None,
                    device=args.device,
                    cache_path=cache_path,
                    budget_s=budget_s,
                    seed=args.seed,
                    reference_points=points,
                    progress=_progress(args.quiet),
                )
            else:
                sources = None
                if args.candidates is not None:
                    if not args.candidates.is_dir():
                        return _fail(f"--candidates {args.candidates} is not a directory")
                    sources = {
                        name: (args.candidates / f"{name}.py").read_text()
                        for name in (names or suite.workload_names())
                        if (args.candidates / f"{name}.py").is_file()
                    }
                document = run_suite(
                    args.profile,
                    workloads=names or None,
                    candidate_sources=sources,
                    device=args.device,
                    seed=args.seed,
                    progress=_progress(args.quiet),
                    reference_points=points,
                )
            ok = document["summary"]["rejected"] == 0 and document["summary"]["errors"] == 0
    except (HarnessError, ValueError) as exc:
        return _fail(str(exc))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(document, indent=2) + "\n")
    print(render_table(document))
    if "optimization" in document:
        print("\n" + _tuning_table(document["optimization"]))
    print(f"\nwrote {args.json}")
    return EXIT_ACCEPTED if ok else EXIT_REJECTED


if __name__ == "__main__":
    sys.exit(main())
