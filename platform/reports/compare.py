"""Two reports side by side: per-workload speedup deltas and whether the newer figure lies
inside the older report's 95% interval (e.g. before and after a driver update, or a re-audit
beside the report it supersedes). Pure.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from reports.document import as_interval, as_number, flatten, workload_label
from runs.figures import model_basis


@dataclass(frozen=True)
class FigureDelta:
    """One speedup in both reports. `within_old_ci` is None when either side lacks the figure."""

    label: str
    old_speedup: float | None
    new_speedup: float | None
    old_ci: tuple[float, float] | None
    new_ci: tuple[float, float] | None
    old_verdict: str | None = None
    new_verdict: str | None = None

    @property
    def delta(self) -> float | None:
        if self.old_speedup is None or self.new_speedup is None:
            return None
        return self.new_speedup - self.old_speedup

    @property
    def delta_percent(self) -> float | None:
        if self.delta is None or not self.old_speedup:
            return None
        return 100.0 * self.delta / self.old_speedup

    @property
    def within_old_ci(self) -> bool | None:
        if self.new_speedup is None or self.old_ci is None:
            return None
        return self.old_ci[0] <= self.new_speedup <= self.old_ci[1]

    @property
    def intervals_overlap(self) -> bool | None:
        if self.old_ci is None or self.new_ci is None:
            return None
        return self.old_ci[0] <= self.new_ci[1] and self.new_ci[0] <= self.old_ci[1]


@dataclass(frozen=True)
class Change:
    key: str
    old: Any
    new: Any


@dataclass(frozen=True)
class Comparison:
    model: FigureDelta
    workloads: tuple[FigureDelta, ...]
    environment: tuple[Change, ...]
    warnings: tuple[str, ...]

    @property
    def figures(self) -> tuple[FigureDelta, ...]:
        """The whole-model figure (where either report has one) and every workload."""
        has_model = self.model.old_speedup is not None or self.model.new_speedup is not None
        return ((self.model,) if has_model else ()) + self.workloads

    @property
    def all_within_old_ci(self) -> bool:
        checked = [d.within_old_ci for d in self.figures if d.within_old_ci is not None]
        return bool(checked) and all(checked)


def compare_bodies(old: dict[str, Any], new: dict[str, Any]) -> Comparison:
    """Compare report bodies (parsed JSON); workloads are matched by name, shape and dtype."""
    old_result, new_result = old.get("result") or {}, new.get("result") or {}
    old_rows = {_key(w): w for w in old_result.get("workloads") or []}
    new_rows = {_key(w): w for w in new_result.get("workloads") or []}
    deltas = []
    for key in list(old_rows) + [k for k in new_rows if k not in old_rows]:
        before, after = old_rows.get(key, {}), new_rows.get(key, {})
        deltas.append(FigureDelta(
            label=workload_label(before or after),
            old_speedup=as_number(before.get("speedup")), new_speedup=as_number(after.get("speedup")),
            old_ci=as_interval(before.get("ci95")), new_ci=as_interval(after.get("ci95")),
            old_verdict=before.get("verdict"), new_verdict=after.get("verdict"),
        ))
    old_model, new_model = old_result.get("model") or {}, new_result.get("model") or {}
    bases = (model_basis(old_result), model_basis(new_result))
    label = f"whole model, {bases[1]}" if bases[0] == bases[1] and bases[1] else "whole model"
    model = FigureDelta(label=label, old_speedup=as_number(old_model.get("speedup")),
                        new_speedup=as_number(new_model.get("speedup")), old_ci=as_interval(old_model.get("ci95")),
                        new_ci=as_interval(new_model.get("ci95")))
    return Comparison(model=model, workloads=tuple(deltas),
                      environment=tuple(_changes(old.get("environment") or {}, new.get("environment") or {})),
                      warnings=tuple(_warnings(old, new)))


def _warnings(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    warnings = []
    old_suite, new_suite = old.get("suite") or {}, new.get("suite") or {}
    if old_suite.get("manifest_sha256") != new_suite.get("manifest_sha256"):
        warnings.append(f"the suites differ ({old_suite.get('version')} vs {new_suite.get('version')}, "
                        "manifest hashes differ): workloads, shapes or tolerances may not be the same")
    old_files = {f.get("sha256") for f in (old.get("model_version") or {}).get("files") or []}
    new_files = {f.get("sha256") for f in (new.get("model_version") or {}).get("files") or []}
    if old_files != new_files:
        warnings.append("the model files differ: these reports measure different models")
    if old.get("artifact_sha256") != new.get("artifact_sha256"):
        warnings.append("the optimization artifacts differ: different optimized kernels were measured")
    bases = [model_basis(body.get("result") or {}) for body in (old, new)]
    if all(bases) and bases[0].split(" (")[0] != bases[1].split(" (")[0]:
        warnings.append(f"the whole-model figures are different measurements: the older report's is {bases[0]}, "
                        f"the newer's {bases[1]}; compare them as such, not as a re-measurement")
    for name, body in (("older", old), ("newer", new)):
        if not (body.get("billing") or {}).get("calibration_stable", False):
            warnings.append(f"the {name} report's A/A calibration was unstable: its figures are not billable")
    return warnings


def _changes(old: dict[str, Any], new: dict[str, Any]) -> list[Change]:
    flat_old, flat_new = dict(flatten(old)), dict(flatten(new))
    return [Change(key, flat_old.get(key), flat_new.get(key))
            for key in sorted(set(flat_old) | set(flat_new)) if flat_old.get(key) != flat_new.get(key)]


def _key(workload: dict[str, Any]) -> str:
    return json.dumps([workload.get("name"), workload.get("shape"), workload.get("dtype")], sort_keys=True)


def reaudit_dict(comparison: Comparison) -> dict[str, Any]:
    """A re-audit beside the report it re-measured, as the API carries it (older = original)."""
    return {
        "all_within_original_ci": comparison.all_within_old_ci,
        "figures": [_figure_dict(d, is_model=d is comparison.model) for d in comparison.figures],
        "warnings": list(comparison.warnings),
        "environment_changes": [{"key": c.key, "original": c.old, "reaudit": c.new} for c in comparison.environment],
    }


def _figure_dict(delta: FigureDelta, *, is_model: bool) -> dict[str, Any]:
    return {
        "label": delta.label, "whole_model": is_model,
        "original": {"speedup": delta.old_speedup, "ci95": list(delta.old_ci) if delta.old_ci else None,
                     "verdict": delta.old_verdict},
        "reaudit": {"speedup": delta.new_speedup, "ci95": list(delta.new_ci) if delta.new_ci else None,
                    "verdict": delta.new_verdict},
        "difference": delta.delta, "difference_percent": delta.delta_percent,
        "within_original_ci": delta.within_old_ci, "intervals_overlap": delta.intervals_overlap,
    }
