"""Result documents (`dyno.suite-result/1`): assembly, schema validation and the readable table.

The JSON written here is what the report signer signs and what billing reads; its shape is fixed
by runners/schemas/suite-result-1.json.
"""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path
from typing import Any, Sequence

SCHEMA_ID = "dyno.suite-result/1"
SCHEMA_PATH = Path(__file__).resolve().parent / "schemas" / "suite-result-1.json"

TOLERANCE_RULE = "|out - ref| <= atol * rms_row(ref) + rtol * |ref| + tiny(dtype), elementwise, ref in float64"
SPEEDUP_STATISTIC = (
    "median over measured rounds of baseline_time / candidate_time, both timed in the same round in "
    "random order; ci95_rounds = paired percentile bootstrap over rounds, two-stage (worker generations, "
    "then rounds within them) when each arm was measured by several successive processes "
    "(timing.worker_generations > 1); ci95 = ci95_rounds, widened by the A/A control's deviation from 1 "
    "(max(aa_high, 1/aa_low)) when one process measured each arm, to cover differences between processes"
)
VERDICT_RULE = (
    "accepted = correct on every check and every integrity/timing check passed, whatever the speed "
    "(a slower correct candidate is accepted with speedup < 1); rejected = any check failed; "
    "error = the candidate crashed, hung, ran out of memory or failed to import. Speedup and CI are "
    "reported only for accepted workloads. billable = accepted and the A/A control stable; "
    "billable_speedup = the ci95 lower bound when billable, the figure billing should use."
)


def finite_or_none(value: float | None) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return float(value)


def build_document(
    *,
    kind: str,
    profile: str,
    suite_version: str,
    manifest_sha256: str,
    environment: dict[str, Any],
    sandbox: dict[str, Any],
    protocol: dict[str, Any],
    workloads: list[dict[str, Any]],
    aa_tolerance: float,
    candidate: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The top-level result; `kind` is 'audit' (adds a verdict) or 'suite'."""
    from runners import stats  # numpy; only needed once results exist

    aa_points = [w["aa"]["speedup"] for w in workloads if w["aa"]["speedup"]]
    aa_lows = [w["aa"]["ci95"][0] for w in workloads if w["aa"]["ci95"]]
    aa_highs = [w["aa"]["ci95"][1] for w in workloads if w["aa"]["ci95"]]
    stable = bool(workloads) and all(w["aa"]["stable"] is not False for w in workloads) and bool(aa_points)
    accepted = [w for w in workloads if w["verdict"] == "accepted"]
    speedups = [w["speedup"] for w in accepted if w["speedup"]]
    document: dict[str, Any] = {
        "schema": SCHEMA_ID,
        "kind": kind,
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "suite": {"version": suite_version, "profile": profile, "manifest_sha256": manifest_sha256},
        "environment": environment,
        "sandbox": sandbox,
        "protocol": {
            **protocol,
            "tolerance_rule": TOLERANCE_RULE,
            "speedup_statistic": SPEEDUP_STATISTIC,
            "verdict_rule": VERDICT_RULE,
        },
        "calibration": {
            "aa_speedup": finite_or_none(stats.geomean(aa_points)) if aa_points else None,
            # The widest A/A interval over workloads: the run is only as stable as its worst one.
            "aa_ci95": [min(aa_lows), max(aa_highs)] if aa_lows else None,
            "aa_tolerance": aa_tolerance,
            "stable": stable,
        },
        "workloads": workloads,
        "summary": {
            "geomean_speedup": finite_or_none(stats.geomean(speedups)) if speedups else None,
            "accepted": len(accepted),
            "rejected": sum(w["verdict"] == "rejected" for w in workloads),
            "errors": sum(w["verdict"] == "error" for w in workloads),
        },
    }
    if kind == "audit":
        document["candidate"] = candidate or {}
        verdicts = {w["verdict"] for w in workloads}
        document["verdict"] = (
            "rejected" if "rejected" in verdicts else "error" if "error" in verdicts or not workloads else "accepted"
        )
    return document


@lru_cache(maxsize=1)
def _schema() -> dict[str, Any]:
    return json.loads(SCHEMA_PATH.read_text())


def validate_document(document: dict[str, Any]) -> None:
    """Raise jsonschema.ValidationError when `document` does not follow dyno.suite-result/1."""
    import jsonschema

    jsonschema.Draft202012Validator(_schema()).validate(document)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds >= 1.0:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds * 1e6:.2f} us"


def render_table(document: dict[str, Any]) -> str:
    """A fixed-width table of the workloads plus the calibration and summary lines."""
    env = document["environment"]
    lines = [
        f"dyno suite v{document['suite']['version']} profile {document['suite']['profile']} "
        f"({document['kind']}) on {env.get('device_name')} / {env.get('cpu_model')}, torch {env.get('torch')}, "
        f"{env.get('threads')} threads, load {', '.join(f'{x:.2f}' for x in env.get('load_average') or [])}",
        f"manifest {document['suite']['manifest_sha256'][:16]}  seed {document['protocol'].get('seed')}",
        "",
    ]
    points = sorted({name for w in document["workloads"] for name in w["reference_points"]})
    header = ("workload", "verdict", "baseline", "candidate", "speedup [95% CI]", "A/A", *points, "reasons")
    rows: list[Sequence[str]] = [header]
    for w in document["workloads"]:
        speed = "-"
        if w["speedup"] is not None and w["ci95"] is not None:
            speed = f"{w['speedup']:.3f} [{w['ci95'][0]:.3f}, {w['ci95'][1]:.3f}]"
        aa = "-" if w["aa"]["speedup"] is None else f"{w['aa']['speedup']:.3f}{'' if w['aa']['stable'] else ' (unstable)'}"
        codes = ", ".join(sorted({r["code"] for r in w["reasons"]})) or "-"
        rows.append(
            (
                f"{w['name']}{_shape_text(w['shape'])} {w['dtype']}",
                w["verdict"],
                _duration(w["baseline"]["median_s"]),
                _duration(w["candidate"]["median_s"]),
                speed,
                aa,
                *(_reference_text(w["reference_points"].get(name)) for name in points),
                codes,
            )
        )
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(header))]
    for index, row in enumerate(rows):
        lines.append("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip())
        if index == 0:
            lines.append("  ".join("-" * width for width in widths))
    cal, summary = document["calibration"], document["summary"]
    lines.append("")
    ci = cal["aa_ci95"]
    lines.append(
        f"A/A calibration: {cal['aa_speedup'] and round(cal['aa_speedup'], 4)} "
        f"CI {ci and [round(ci[0], 4), round(ci[1], 4)]} within 1 +- {cal['aa_tolerance']}: "
        f"{'stable' if cal['stable'] else 'UNSTABLE (not billable)'}"
    )
    geo = summary["geomean_speedup"]
    lines.append(
        f"summary: {summary['accepted']} accepted, {summary['rejected']} rejected, {summary['errors']} errors; "
        f"geomean speedup of accepted {geo:.3f}" if geo is not None else
        f"summary: {summary['accepted']} accepted, {summary['rejected']} rejected, {summary['errors']} errors"
    )
    if document["kind"] == "audit":
        lines.append(f"verdict: {document['verdict']}")
    return "\n".join(lines)


def _reference_text(point: dict[str, Any] | None) -> str:
    if not point or point.get("median_s") is None:
        return "-"
    ratio = point.get("speedup_vs_baseline")
    return f"{_duration(point['median_s'])} ({ratio:.2f}x)" if ratio else _duration(point["median_s"])


def _shape_text(shape: dict[str, int]) -> str:
    return "[" + ",".join(f"{k}={v}" for k, v in shape.items()) + "]"
