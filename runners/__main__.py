"""Command line: `python -m runners audit|suite|model-audit|calibrate` measure and write JSON; `compare-report`
sets such a measurement beside the signed report it reproduces (every report prints the recipe).

The optimizer's tuned suite is `python -m pipeline suite` (the judge never imports the optimizer); it
audits what the optimizer chose exactly as `suite --candidates` audits a directory. `model-audit` is the whole-model
audit a model run does (runners.modelaudit): the model folder eager against an optimization artifact.

Exit codes: 0 accepted (suite: nothing rejected or errored; compare-report: every figure agrees), 1
rejected or errored (JSON still written; compare-report: a figure differs), 2 the command could not
run (bad arguments, unknown workload, a file that is not what it should be; message on stderr).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import secrets
import sys
from pathlib import Path
from typing import Any, Sequence

from runners.cli import EXIT_ACCEPTED, EXIT_REJECTED
from runners.cli import Parser as _Parser
from runners.cli import fail as _fail
from runners.cli import progress_lines as _progress
from runners.cli import selection
from runners.cli import write_json as _write

REPORT_SCHEMA = "dyno.report/1"  # platform/reports/document.py writes it; only read here


class _CannotRun(Exception):
    """The command cannot run as asked; the message says what was wrong and what to do."""


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m runners", description="Dyno's audited benchmark harness (suite v1).")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def common(sub: argparse.ArgumentParser, *, reference_points: bool = True) -> None:
        sub.add_argument("--profile", required=True, help="cpu-ci, cpu or gpu")
        sub.add_argument("--json", required=True, type=Path, help="where to write the result JSON")
        sub.add_argument("--device", default=None, help="cpu or cuda[:N]; default: the profile's device")
        sub.add_argument("--seed", type=int, default=None, help="fix the input seeds (default: fresh random)")
        if reference_points:
            sub.add_argument(
                "--reference-points",
                default=None,
                help="comma-separated reference points to time beside the baseline (torch-compile); "
                "default: none",
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
        "--artifact", type=Path, default=None,
        help="a model run's artifact.json: audit the kernels it carries (`audited`) at the model's own shapes, "
        "the per-workload audits its billed model figure is weighted from",
    )
    common(suite_cmd)
    model = commands.add_parser(
        "model-audit",
        help="the whole-model audit: a model folder's forward pass, eager against an optimization artifact",
        description="Writes {artifact_sha256, seed, end_to_end}; end_to_end is the block a model run's result "
        "carries at model.end_to_end (prefill, and decode where the model keeps a cache).",
    )
    model.add_argument("--model", required=True, type=Path,
                       help="the Hugging Face model folder (config.json, safetensors)")
    model.add_argument("--artifact", required=True, type=Path,
                       help="a dyno.optimization-artifact/1 file, e.g. a run's artifact.json")
    model.add_argument("--batch", required=True, type=_positive_int, help="sequences per forward pass")
    model.add_argument("--seq", required=True, type=_positive_int,
                       help="tokens per sequence (and the decode cache length)")
    common(model, reference_points=False)
    calibrate = commands.add_parser(
        "calibrate",
        help="A/A audits of a profile's workloads: can this machine produce billable figures?",
        description="Exit 0: every A/A control is stable and the baseline is accepted against itself (figures "
        "measured here can bill). Exit 1: not (the JSON and the table say which workloads). Exit 2: cannot run.",
    )
    calibrate.add_argument("--workloads", default="", help="comma-separated subset (default: all)")
    common(calibrate, reference_points=False)
    compare = commands.add_parser(
        "compare-report",
        help="set a reproduction's figures beside the signed report's 95%% intervals",
        description="Exit 0: every reproduced figure agrees with the report (same verdict, and the speedup "
        "inside the report's 95%% CI). Exit 1: one differs. Exit 2: the files do not belong together.",
    )
    compare.add_argument("report", type=Path, help="the report body as signed (the report page's JSON download)")
    compare.add_argument("result", type=Path, help="what `audit` or `model-audit` wrote with --json")
    return parser


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be at least 1")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    if args.command == "calibrate":
        return _calibrate(args)
    if args.command == "compare-report":
        try:
            return _compare_report(args.report, args.result)
        except _CannotRun as exc:
            return _fail(str(exc))
    from runners import suite

    if args.profile not in suite.profile_names():
        return _fail(f"unknown profile {args.profile!r}; use one of {', '.join(suite.profile_names())}")
    if args.command == "model-audit":
        try:
            document, ok = _model_audit(args)
        except _CannotRun as exc:
            return _fail(str(exc))
        _write(args.json, document)
        print(_phase_table(document["end_to_end"]))
        print(f"\nwrote {args.json}")
        return EXIT_ACCEPTED if ok else EXIT_REJECTED
    return _kernel_audit(args)


def _calibrate(args: argparse.Namespace) -> int:
    from runners.calibrate import calibrate, render
    from runners.evaluate import HarnessError

    names, problem = selection(args.profile, args.workloads)
    if problem:
        return _fail(problem)
    try:
        document = calibrate(args.profile, workloads=names or None, device=args.device, seed=args.seed,
                             progress=_progress(args.quiet))
    except (HarnessError, ValueError) as exc:
        return _fail(str(exc))
    _write(args.json, document)
    print(render(document))
    print(f"\nwrote {args.json}")
    return EXIT_ACCEPTED if document["verdict"]["billable"] else EXIT_REJECTED


def _kernel_audit(args: argparse.Namespace) -> int:
    """`audit` and `suite`: candidates against the suite's baselines."""
    from runners import suite
    from runners.evaluate import HarnessError, audit_candidate, run_suite
    from runners.result import render_table

    points = [p for p in (args.reference_points or "").split(",") if p]
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
            if args.artifact is not None:
                from runners.evaluate import audit_specs

                if names:
                    return _fail("--workloads does not apply with --artifact: it audits the kernels the artifact carries")
                try:
                    specs, sources = _artifact_kernels(args.artifact, args.profile)
                except _CannotRun as exc:
                    return _fail(str(exc))
                document = audit_specs(specs, sources, keys=[spec.key for spec in specs], profile=args.profile,
                                       device=args.device, seed=args.seed, progress=_progress(args.quiet),
                                       reference_points=points, label="dyno optimizer")
                document["artifact_sha256"] = hashlib.sha256(args.artifact.read_bytes()).hexdigest()
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
    _write(args.json, document)
    print(render_table(document))
    print(f"\nwrote {args.json}")
    return EXIT_ACCEPTED if ok else EXIT_REJECTED


def _artifact_kernels(path: Path, profile: str) -> tuple[list[Any], list[str]]:
    """The suite specs and sources of the kernels a model run's artifact says it audited."""
    from runners import suite

    try:
        artifact = json.loads(path.read_bytes())
    except OSError as exc:
        raise _CannotRun(f"cannot read artifact {path}: {exc.strerror}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _CannotRun(f"artifact {path} is not JSON ({exc}); download it again from the run page") from None
    audited = artifact.get("audited") if isinstance(artifact, dict) else None
    if not isinstance(audited, dict) or not audited:
        raise _CannotRun(f"{path} carries no audited kernels (`audited`): it is not a model run's artifact, or "
                         "was made before artifacts carried them; reproduce the whole-model figure with model-audit")
    specs, sources = [], []
    for key, source in sorted(audited.items()):
        try:
            specs.append(suite.spec_for_key(profile, key))
        except ValueError as exc:
            raise _CannotRun(f"{path}: {exc}") from None
        if not isinstance(source, str):
            raise _CannotRun(f"{path}: the kernel of {key} is not Python source text")
        sources.append(source)
    return specs, sources


# --- model-audit ---------------------------------------------------------------------------------


def _model_audit(args: argparse.Namespace) -> tuple[dict[str, Any], bool]:
    """The whole-model audit of `args.model` against the artifact file; the document written and
    whether every phase that ran was accepted. Raises _CannotRun for what the user can fix."""
    from runners import suite
    from runners.artifact import artifact_document
    from runners.modelaudit import ModelAuditError, audit_model_forward
    from runners.sandbox import SandboxError

    if not (args.model / "config.json").is_file():
        raise _CannotRun(f"--model {args.model} is not a model folder (no config.json in it)")
    try:
        raw = args.artifact.read_bytes()
    except OSError as exc:
        raise _CannotRun(f"cannot read artifact {args.artifact}: {exc.strerror}") from None
    try:
        artifact = artifact_document(json.loads(raw))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _CannotRun(f"artifact {args.artifact} is not JSON ({exc}); download it again from the run page") from None
    except (AttributeError, TypeError, ValueError) as exc:  # not an object, unknown fields, wrong schema
        raise _CannotRun(f"{args.artifact} is not a Dyno optimization artifact: {exc}") from None
    seed = secrets.randbits(62) if args.seed is None else args.seed
    try:
        block = audit_model_forward(
            args.model,
            artifact,
            batch=args.batch,
            seq=args.seq,
            device=args.device or suite.profile_device(args.profile),
            profile=args.profile,
            seed=seed,
            progress=_progress(args.quiet),
        )
    except (ModelAuditError, SandboxError, ValueError) as exc:
        raise _CannotRun(f"the model audit could not run: {exc}") from None
    ran = [p for p in block["phases"] if p["verdict"] != "skipped"]
    # The bytes' hash, not the content's: compare-report matches it against the report's artifact_sha256.
    document = {"artifact_sha256": hashlib.sha256(raw).hexdigest(), "seed": seed, "end_to_end": block}
    return document, bool(ran) and all(p["verdict"] == "accepted" for p in ran)


def _phase_table(block: dict[str, Any]) -> str:
    lines = [f"whole model ({block.get('model_class')}, {block.get('dtype')}) on {block.get('device')}, "
             f"profile {block.get('profile')}, artifact strategy {block.get('artifact_strategy')}"]
    for phase in block["phases"]:
        figure = _figure_text(phase)
        aa = phase.get("aa") or {}
        stable = "" if aa.get("stable") is not False else ", A/A unstable"
        codes = ", ".join(sorted({r["code"] for r in phase.get("reasons") or []}))
        line = f"  {phase['phase']}: {phase['verdict']} {figure}{stable}"
        if codes:
            line += f" ({codes})"
        if phase.get("note"):
            line += f" - {phase['note']}"
        lines.append(line)
    return "\n".join(lines)


# --- compare-report ------------------------------------------------------------------------------


def _compare_report(report_path: Path, result_path: Path) -> int:
    """Each figure the reproduction measured beside the report's: agrees when the verdict is the same
    and, where both have a speedup, the reproduced speedup lies inside the report's 95% CI."""
    report = _read_json(report_path, "report")
    measured = _read_json(result_path, "result")
    if report.get("schema") != REPORT_SCHEMA:
        raise _CannotRun(f"{report_path} is not a Dyno report body (schema {report.get('schema')!r}, expected "
                         f"{REPORT_SCHEMA!r}); save the report page's 'Report (JSON, as signed)' download")
    signed = report.get("result") or {}
    if "end_to_end" in measured:
        pairs, notes = _model_pairs(report, measured)
    elif measured.get("schema") == signed.get("schema") and "workloads" in measured:
        pairs, notes = _workload_pairs(signed, measured)
        pairs += _billed_model_pair(report, measured)
    else:
        raise _CannotRun(f"{result_path} is neither what `python -m runners audit|suite` nor what "
                         "`python -m runners model-audit` writes with --json")
    if not pairs:
        raise _CannotRun("the result measured none of the figures the report holds; run the report's own command")
    agree = True
    for label, ours, theirs in pairs:
        same, why = _agreement(ours, theirs)
        agree = agree and same
        print(f"{label}: reproduced {ours.get('verdict')} {_figure_text(ours)}; report {theirs.get('verdict')} "
              f"{_figure_text(theirs)}: {'agrees' if same else 'DIFFERS'} ({why})")
    for note in notes:
        print(f"note: {note}")
    print("the reproduction agrees with the report" if agree else "the reproduction differs from the report")
    return EXIT_ACCEPTED if agree else EXIT_REJECTED


Pair = tuple[str, dict[str, Any], dict[str, Any]]  # (label, reproduced figure, the report's figure)


def _model_pairs(report: dict[str, Any], measured: dict[str, Any]) -> tuple[list[Pair], list[str]]:
    signed = report.get("result") or {}
    theirs = (signed.get("model") or {}).get("end_to_end")
    ours = measured["end_to_end"] or {}
    if not isinstance(theirs, dict):
        raise _CannotRun("the report holds no whole-model (end-to-end) figure to compare a model-audit with")
    if theirs.get("error"):
        raise _CannotRun(f"the report's end-to-end audit did not run ({theirs['error'][:200]}); nothing to compare")
    if measured.get("artifact_sha256") != report.get("artifact_sha256"):
        raise _CannotRun(f"the result measured artifact {measured.get('artifact_sha256')}, the report's is "
                         f"{report.get('artifact_sha256')}: download the artifact from the run page again "
                         "(a re-saved or re-formatted file has another hash)")
    for name in ("shape", "profile"):
        if ours.get(name) != theirs.get(name):
            raise _CannotRun(f"the result measured {name} {ours.get(name)}, the report {theirs.get(name)}; "
                             "use the report's --batch, --seq and --profile")
    notes = _seed_note(measured.get("seed"), signed)
    if any((p.get("aa") or {}).get("stable") is False for p in ours.get("phases") or []):
        notes.append("this machine's A/A control was unstable: its figures are too noisy to judge by")
    model = signed.get("model") or {}
    if model.get("basis") == "end_to_end" and model.get("billed_phase"):
        notes.append(f"the billed model figure is the end-to-end {model['billed_phase']} phase, compared above")
    elif model.get("ci95") and model.get("basis") != "end_to_end":
        notes.append("the billed model figure (result.model: per-workload audits weighted by eager time) is not "
                     "re-measured by model-audit; the end-to-end phases are")
    by_phase = {p.get("phase"): p for p in theirs.get("phases") or []}
    pairs = [(f"model {p['phase']}", p, by_phase[p["phase"]]) for p in ours.get("phases") or []
             if p.get("phase") in by_phase and not (p["verdict"] == by_phase[p["phase"]].get("verdict") == "skipped")]
    return pairs, notes


def _workload_pairs(signed: dict[str, Any], measured: dict[str, Any]) -> tuple[list[Pair], list[str]]:
    ours_suite, theirs_suite = measured.get("suite") or {}, signed.get("suite") or {}
    if ours_suite.get("profile") != theirs_suite.get("profile"):
        raise _CannotRun(f"the result ran profile {ours_suite.get('profile')!r}, the report "
                         f"{theirs_suite.get('profile')!r}; use the report's --profile")
    ours_candidate = (measured.get("candidate") or {}).get("source_sha256")
    theirs_candidate = (signed.get("candidate") or {}).get("source_sha256")
    if theirs_candidate and ours_candidate != theirs_candidate:
        raise _CannotRun(f"the result audited candidate {ours_candidate}, the report's is {theirs_candidate}: "
                         "download the candidate from the run page again")
    notes = _seed_note((measured.get("protocol") or {}).get("seed"), signed)
    if ours_suite.get("manifest_sha256") != theirs_suite.get("manifest_sha256"):
        notes.append("the suite manifests differ (another suite version or protocol settings): the figures may "
                     "not be measured the same way")
    if (measured.get("calibration") or {}).get("stable") is False:
        notes.append("this machine's A/A control was unstable: its figures are too noisy to judge by")

    def key(w: dict[str, Any]) -> str:
        return json.dumps([w.get("name"), w.get("shape"), w.get("dtype")], sort_keys=True)

    by_key = {key(w): w for w in signed.get("workloads") or []}
    pairs = [(f"{w.get('name')} {_shape(w.get('shape'))} {w.get('dtype')}", w, by_key[key(w)])
             for w in measured.get("workloads") or [] if key(w) in by_key]
    missing = len(by_key) - len(pairs)
    if missing > 0:
        notes.append(f"{missing} of the report's workloads were not measured by this result")
    return pairs, notes


def _billed_model_pair(report: dict[str, Any], measured: dict[str, Any]) -> list[Pair]:
    """The billed model figure recomputed from the reproduced kernel audits with the report's own
    signed weights (the run's formula, runners.modelplan.weighted_figure), beside the signed one."""
    from runners.modelplan import weighted_figure

    model = (report.get("result") or {}).get("model") or {}
    weights = {w.get("key"): float(w.get("weight") or 0.0) for w in model.get("weighting") or []}
    # Since the end-to-end basis the Amdahl figure is a diagnostic beside the billed one.
    end_to_end = model.get("basis") == "end_to_end"
    amdahl = (model.get("amdahl") or {}) if end_to_end else model
    if not weights or not isinstance(amdahl.get("ci95"), list):
        return []
    if measured.get("artifact_sha256") not in (None, report.get("artifact_sha256")):
        raise _CannotRun(f"the result audited the kernels of artifact {measured.get('artifact_sha256')}, the "
                         f"report's is {report.get('artifact_sha256')}: download the artifact from the run page again")
    speedup, low, high = weighted_figure(measured.get("workloads") or [], weights)
    ours = {"verdict": "weighted", "speedup": speedup, "ci95": [low, high]}
    theirs = {"verdict": "weighted", "speedup": amdahl.get("speedup"), "ci95": amdahl.get("ci95")}
    label = ("Amdahl model figure (a diagnostic; the end-to-end figure bills)" if end_to_end
             else "model figure (billed; kernel audits weighted by the report's eager-time shares)")
    return [(label, ours, theirs)]


def _seed_note(seed: Any, signed: dict[str, Any]) -> list[str]:
    theirs = (signed.get("protocol") or {}).get("seed")
    if theirs is not None and seed != theirs:
        return [f"measured with seed {seed}, the report with {theirs}: other inputs, same protocol"]
    return []


def _agreement(ours: dict[str, Any], theirs: dict[str, Any]) -> tuple[bool, str]:
    if ours.get("verdict") != theirs.get("verdict"):
        return False, "the verdicts differ"
    speedup, ci = ours.get("speedup"), theirs.get("ci95")
    if not isinstance(speedup, (int, float)) or not (isinstance(ci, list) and len(ci) == 2):
        return True, "same verdict, no speedup to compare"
    inside = ci[0] <= speedup <= ci[1]
    return inside, f"reproduced speedup {speedup:.3f} {'inside' if inside else 'outside'} the report's 95% CI"


def _figure_text(figure: dict[str, Any]) -> str:
    speedup, ci = figure.get("speedup"), figure.get("ci95")
    if not isinstance(speedup, (int, float)) or not (isinstance(ci, list) and len(ci) == 2):
        return "(no speedup)"
    return f"{speedup:.3f}x [{ci[0]:.3f}, {ci[1]:.3f}]"


def _shape(shape: Any) -> str:
    return ",".join(f"{k}={v}" for k, v in shape.items()) if isinstance(shape, dict) else str(shape)


def _read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        document = json.loads(path.read_bytes())
    except OSError as exc:
        raise _CannotRun(f"cannot read {what} {path}: {exc.strerror}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _CannotRun(f"{what} {path} is not JSON ({exc})") from None
    if not isinstance(document, dict):
        raise _CannotRun(f"{what} {path} is not a JSON object")
    return document


if __name__ == "__main__":
    sys.exit(main())
