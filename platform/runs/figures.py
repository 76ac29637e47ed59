"""How a run's result reads for billing: which figure of its model block bills, and whether it was
measured on a stable machine. The runs app stores both with the run; reports print them.
"""

from __future__ import annotations

from typing import Any

# The decimal columns a signed report copies a run's model figure into (reports.models.Report's
# model_speedup and CI bounds); declared here, below reports, so that a run's result can be held
# to what a report of it will store (runs.services.result_problem).
FIGURE_COLUMN = {"max_digits": 12, "decimal_places": 6}


def model_stable(result: dict[str, Any]) -> bool:
    """Whether the figure that bills was measured on a stable machine: the end-to-end audit's own
    A/A controls for a model block on that basis, the suite's calibration otherwise."""
    block = result.get("model") or {}
    if block.get("basis") == "end_to_end":
        return block.get("stable") is True
    # `is True`, not truth: a runner's "no" or 1 is not a stable calibration (red team 18).
    return (result.get("calibration") or {}).get("stable") is True


def model_basis(result: dict[str, Any]) -> str | None:
    """Which figure of a result's model block bills, in words (None without a model block)."""
    block = result.get("model") or {}
    if not block:
        return None
    if block.get("basis") == "end_to_end":
        phase = block.get("billed_phase")
        return f"end_to_end ({phase})" if phase else "end_to_end (no phase accepted)"
    return "amdahl (kernel audits weighted by eager time)"
