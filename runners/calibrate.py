"""Calibration of a machine: can it produce billable figures at all?

The baseline of every workload of a profile is audited against itself (`run_suite` with no
candidates: baseline, the baseline as candidate, and the A/A control, each in its own worker).
A figure bills only when its A/A control is stable (the A/A 95% CI inside 1 +- the profile's
tolerance), so a machine whose A/A controls are unstable measures figures that bill nothing; this
says so before any customer's run is spent on it. `python -m runners calibrate` prints it; a
runner calibrates when it starts (`DYNO_RUNNER_CALIBRATION_PROFILE`), the fleet page shows the
verdict, and a report measured on a runner whose calibration failed does not bill.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Sequence

SCHEMA = "dyno.calibration/1"


def calibrate(profile: str, *, workloads: Sequence[str] | None = None, device: str | None = None,
              seed: int | None = None, progress: Any = None) -> dict[str, Any]:
    """A/A audits of `profile`'s workloads (all by default) and the verdict on this machine."""
    from runners.evaluate import run_suite

    document = run_suite(profile, workloads=list(workloads) if workloads else None, device=device, seed=seed,
                         progress=progress)
    return calibration_from_suite(document)


def calibration_from_suite(document: dict[str, Any]) -> dict[str, Any]:
    """The calibration summary of an A/A suite document (`run_suite` without candidates)."""
    tolerance = float(document["calibration"]["aa_tolerance"])
    rows = []
    for w in document["workloads"]:
        aa = w.get("aa") or {}
        ci = aa.get("ci95")
        point = aa.get("speedup")
        rows.append({
            "key": w.get("key") or w.get("name"),
            "aa_speedup": point,
            "aa_ci95": ci,
            "aa_half_width": (ci[1] - ci[0]) / 2 / point if ci and point else None,
            "stable": aa.get("stable") is True,
            # The baseline audited as a candidate must be accepted: a rejection here is the harness
            # rejecting honest code on this machine.
            "baseline_verdict": w.get("verdict"),
            "reasons": sorted({r.get("code", "") for r in w.get("reasons") or []}),
        })
    unstable = [r["key"] for r in rows if not r["stable"]]
    rejected = [r["key"] for r in rows if r["baseline_verdict"] != "accepted"]
    widths = sorted(r["aa_half_width"] for r in rows if r["aa_half_width"] is not None)
    billable = bool(rows) and not unstable and not rejected
    if billable:
        message = (f"this machine can produce billable figures on profile {document['suite']['profile']}: every "
                   f"A/A control of {len(rows)} workloads lies within 1 +- {tolerance:g}")
    elif not rows:
        message = "nothing was measured: no workload ran"
    else:
        parts = []
        if unstable:
            parts.append(f"{len(unstable)} of {len(rows)} A/A controls unstable ({', '.join(unstable)})")
        if rejected:
            parts.append(f"the baseline was not accepted against itself on {', '.join(rejected)}")
        message = ("figures measured here will not bill: " + "; ".join(parts) +
                   ". Quiet the machine (no other load, fixed clocks, isolated cores) and calibrate again.")
    return {
        "schema": SCHEMA,
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "profile": document["suite"]["profile"],
        "suite": document["suite"],
        "environment": document.get("environment") or {},
        "aa_tolerance": tolerance,
        "workloads": rows,
        "summary": {
            "workloads": len(rows),
            "unstable": len(unstable),
            "baseline_rejected": len(rejected),
            "median_aa_half_width": widths[len(widths) // 2] if widths else None,
        },
        "verdict": {"billable": billable, "message": message},
    }


def render(calibration: dict[str, Any]) -> str:
    """The table `python -m runners calibrate` prints, verdict last."""
    lines = [f"calibration on profile {calibration['profile']} (A/A tolerance 1 +- {calibration['aa_tolerance']:g})",
             f"{'workload':<48} {'A/A':>7} {'95% CI':>17} {'half-width':>10}  stable  baseline"]
    for row in calibration["workloads"]:
        ci = row["aa_ci95"]
        ci_text = f"[{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "-"
        point = f"{row['aa_speedup']:.3f}" if row["aa_speedup"] else "-"
        width = f"{row['aa_half_width']:.1%}" if row["aa_half_width"] is not None else "-"
        lines.append(f"{row['key'][:48]:<48} {point:>7} {ci_text:>17} {width:>10}  "
                     f"{'yes' if row['stable'] else 'NO':<6}  {row['baseline_verdict']}")
    lines.append(("BILLABLE: " if calibration["verdict"]["billable"] else "NOT BILLABLE: ")
                 + calibration["verdict"]["message"])
    return "\n".join(lines)
