"""What the judge computes for a model run: which suite workloads a model's profile maps to
(`plan_workloads`), the whole-model figures from the audited entries (`model_figure`, the Amdahl
diagnostic; `billed_model_block`, the end-to-end figure that bills) and the whole-forward audit,
fail-soft (`end_to_end_audit`). The run itself (profile -> optimize -> audit) is
`pipeline.model_run.run_model_pipeline`: the optimizer proposes, these functions judge.

Two model-level figures, on purpose. `result["model"]["end_to_end"]` is the whole forward pass
measured directly (runners.modelaudit: prefill, and decode where the model keeps a cache), eager
against the artifact applied, with its own A/A control: it measures what is deployed, whatever the
artifact's strategy (patched modules or a whole-model compile), and it is what bills:
`result["model"]` speedup and ci95 are those of the audited phase with the lowest CI lower bound
(`basis: "end_to_end"`), stable only when every audited phase's A/A control is. The Amdahl figure
(`result["model"]["amdahl"]`: the audited per-workload speedups weighted by each workload's share of
the model's eager time) stays beside it as a diagnostic: it proves each kernel and says how much of
the model they cover, but a whole-model compile deploys none of them.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runners import suite
from runners.redact import exception_text
from runners.suite import WorkloadSpec

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class PlannedWorkload:
    """One distinct workload the model executes, as the suite can measure it."""

    key: str  # name plus shape and dtype, unique within a run
    spec: WorkloadSpec
    count: int
    eager_time_s: float


@dataclass(frozen=True)
class Unsupported:
    family: str
    shape: dict[str, Any]
    eager_time_s: float
    reason: str


def plan_workloads(inventory: dict[str, Any], *, profile: str, limit: int) -> tuple[list[PlannedWorkload], list[Unsupported]]:
    """Turn inventory entries into suite specs; the `limit` heaviest are audited, the rest count as 1x."""
    names = set(suite.workload_names())
    planned: dict[str, PlannedWorkload] = {}
    unsupported: list[Unsupported] = []
    for entry in inventory.get("workloads", []):
        family, shape, eager = entry["family"], dict(entry["shape"]), float(entry.get("eager_time_s") or 0.0)
        attrs = entry.get("attrs") or {}
        reason = None
        if family not in names:
            reason = f"{family} is not a suite workload"
        elif family == "attention_prefill" and attrs.get("causal") is False:
            reason = "non-causal attention is not in suite v1 (causal GQA only)"
        elif family == "moe" and shape.pop("topk", 2) != 2:
            reason = "suite v1 measures top-2 routing only"
        elif attrs.get("batch") or attrs.get("bias"):
            reason = "batched or biased matrix products are not in suite v1"
        template = suite.find_spec(profile, family)[0] if reason is None else None
        if template is not None and set(template.shape) != set(shape):
            reason = f"shape keys {sorted(shape)} do not match the suite's {sorted(template.shape)}"
        if reason is not None:
            unsupported.append(Unsupported(family, shape, eager, reason))
            continue
        spec = dataclasses.replace(template, shape={k: int(shape[k]) for k in template.shape}, dtype=entry["dtype"])
        key = spec.key
        if key in planned:  # the same shape seen from two call sites
            old = planned[key]
            planned[key] = dataclasses.replace(old, count=old.count + int(entry.get("count", 1)),
                                               eager_time_s=old.eager_time_s + eager)
        else:
            planned[key] = PlannedWorkload(key, spec, int(entry.get("count", 1)), eager)
    ranked = sorted(planned.values(), key=lambda w: w.eager_time_s, reverse=True)
    for extra in ranked[limit:]:
        unsupported.append(Unsupported(extra.spec.name, extra.spec.shape, extra.eager_time_s,
                                       f"outside the {limit} heaviest workloads audited in this run"))
    return ranked[:limit], unsupported


def model_figure(entries: list[dict[str, Any]], planned: list[PlannedWorkload], total_time_s: float,
                 unsupported: list[Unsupported]) -> dict[str, Any]:
    """The whole-model speedup implied by the audited workloads, weighted by eager time (Amdahl).

    Each workload's share of the model's instrumented eager time runs `speedup` times faster; the
    rest (unsupported, unaudited, rejected) runs at 1x. The CI bounds use each workload's CI
    bounds the same way, which is conservative for the lower bound a bill uses.
    """
    by_key = {e.get("key"): e for e in entries}
    weighting = []
    for w in planned:
        share = w.eager_time_s / total_time_s if total_time_s > 0 else 0.0
        entry = by_key.get(w.key) or {}
        accepted = _accepted(entry)
        weighting.append({"key": w.key, "name": w.spec.name, "count": w.count, "weight": share,
                          "eager_time_s": w.eager_time_s, "speedup": entry["speedup"] if accepted else None,
                          "verdict": entry.get("verdict", "error")})
    speedup, low, high = weighted_figure(entries, {w["key"]: w["weight"] for w in weighting})
    figure = {
        "speedup": speedup, "ci95": [low, high],
        "method": "amdahl over audited workloads weighted by instrumented eager time; unaudited work at 1x",
        "audited_share": sum(w["weight"] for w in weighting), "weighting": weighting,
        "unsupported": [dataclasses.asdict(u) for u in unsupported],
    }
    if not all(math.isfinite(v) for v in [figure["speedup"], *figure["ci95"]]):
        raise ValueError("model figure is not finite")
    return figure


def _accepted(entry: dict[str, Any]) -> bool:
    return bool(entry.get("verdict") == "accepted" and entry.get("speedup") and entry.get("ci95"))


def weighted_figure(entries: list[dict[str, Any]], weights: dict[str, float]) -> tuple[float, float, float]:
    """(speedup, CI low, CI high) of the whole model: each workload key's share of the eager time
    runs its audited speedup (or CI bound) faster, 1x unless accepted; the rest of the time at 1x.
    The model figure of a run, and what `compare-report` recomputes from a reproduction."""
    by_key = {e.get("key"): e for e in entries}
    point = low = high = 0.0
    for key, share in weights.items():
        entry = by_key.get(key) or {}
        s, (lo, hi) = (entry["speedup"], entry["ci95"]) if _accepted(entry) else (1.0, (1.0, 1.0))
        point += share / s
        low += share / lo
        high += share / hi
    rest = max(0.0, 1.0 - sum(weights.values()))
    return 1.0 / (point + rest), 1.0 / (low + rest), 1.0 / (high + rest)


END_TO_END_METHOD = ("whole forward pass audited end to end (eager transformers against the artifact applied, "
                     "A/A control); the audited phase (prefill, decode) with the lowest 95% CI lower bound bills")


def billed_model_block(amdahl: dict[str, Any], end_to_end: dict[str, Any]) -> dict[str, Any]:
    """The model block of a run's result: the end-to-end figure that bills, the Amdahl figure beside it.

    Every audited (not skipped) phase must be accepted for a figure to exist; the billed one is the
    phase with the lowest CI lower bound, and it is stable only if every audited phase's A/A
    control is. An end-to-end audit that could not run, or that rejected the artifact, leaves no
    billable figure (speedup None) and says why; the Amdahl figure never stands in for it."""
    block: dict[str, Any] = {key: value for key, value in amdahl.items() if key not in ("speedup", "ci95", "method")}
    block["amdahl"] = {"speedup": amdahl["speedup"], "ci95": amdahl["ci95"], "method": amdahl["method"]}
    block["end_to_end"] = end_to_end
    block["basis"] = "end_to_end"
    phases = [p for p in end_to_end.get("phases") or [] if p.get("verdict") != "skipped"]
    if end_to_end.get("error") or not phases:
        why = ("the end-to-end audit did not run" if end_to_end.get("error")
               else "the end-to-end audit measured no phase")
        block.update(speedup=None, ci95=None, stable=False, verdict="error", method=END_TO_END_METHOD,
                     reasons=[{"code": "model.no_end_to_end", "message": why}])
        return block
    refused = [p for p in phases if p.get("verdict") != "accepted" or not p.get("ci95")]
    if refused:
        reasons = [{"code": r.get("code"), "message": f"{p['phase']}: {r.get('message', '')}"}
                   for p in refused for r in p.get("reasons") or []]
        block.update(speedup=None, ci95=None, stable=False, verdict=refused[0].get("verdict") or "rejected",
                     method=END_TO_END_METHOD, reasons=reasons or [{"code": "model.rejected_end_to_end",
                                                                   "message": f"{refused[0]['phase']} was not accepted"}])
        return block
    billed = min(phases, key=lambda p: p["ci95"][0])
    block.update(speedup=billed["speedup"], ci95=list(billed["ci95"]), billed_phase=billed["phase"],
                 stable=all((p.get("aa") or {}).get("stable") is True for p in phases), verdict="accepted",
                 method=END_TO_END_METHOD, reasons=[], not_billable=_not_billable(billed, phases, end_to_end))
    return block


def _not_billable(billed: dict[str, Any], phases: list[dict[str, Any]], end_to_end: dict[str, Any]) -> list[dict[str, str]]:
    """Why an accepted end-to-end figure does not bill, check by check (empty when it bills on
    what the audit measured; the platform adds what it knows, such as the host's sandbox)."""
    tolerance = (end_to_end.get("protocol") or {}).get("aa_tolerance")
    notes = []
    for phase in phases:
        aa = phase.get("aa") or {}
        if aa.get("stable") is not True:
            ci = aa.get("ci95") or [None, None]
            where = f"{ci[0]:.3f}-{ci[1]:.3f}" if None not in ci else "not measured"
            bound = f" outside 1 +- {tolerance:g}" if isinstance(tolerance, (int, float)) else ""
            notes.append({"code": "model.aa_unstable",
                          "message": f"{phase['phase']}: two identical baseline workers differ (A/A 95% CI {where}{bound}), "
                                     "so no difference of that size can be told from noise"})
    low = billed["ci95"][0]
    if low <= 1.0:
        notes.append({"code": "model.no_proven_speedup",
                      "message": f"{billed['phase']}: the 95% CI lower bound {low:.3f} is not above 1, so no speedup is proven"})
    slower = [p for p in phases if p["ci95"][1] < 1.0]
    for phase in slower:
        low, high = phase["ci95"]
        notes.append({"code": "model.slower",
                      "message": f"{phase['phase']}: the optimized model is slower than the unmodified one (95% CI "
                                 f"{low:.3f}-{high:.3f}, wholly below 1); do not deploy this artifact, keep the "
                                 "unmodified model"})
    return notes


def replay_plan(inventory: dict[str, Any], *, profile: str,
                 audited: dict[str, str]) -> tuple[list[PlannedWorkload], list[Unsupported]]:
    """The workloads the re-audited run audited, as this machine's profile sees them (their eager
    times weight the model figure afresh); a key the profile no longer finds is left out (1x)."""
    everything, unsupported = plan_workloads(inventory, profile=profile, limit=len(inventory.get("workloads", [])) + 1)
    planned = [w for w in everything if w.key in audited]
    unsupported += [Unsupported(w.spec.name, w.spec.shape, w.eager_time_s, "not audited by the re-audited run")
                    for w in everything if w.key not in audited]
    return planned, unsupported


class _CallerAbort(Exception):
    """An exception the caller's progress callback raised, carried through the fail-soft net."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


def end_to_end_audit(model_dir: Path, artifact: Any, *, batch: int, seq: int, device: str, profile: str, seed: int,
                     progress: Callable[[float, str], None]) -> dict[str, Any]:
    """The whole-forward audit (runners.modelaudit), fail-soft: the per-workload audit already
    stands on its own, so a failure here is recorded as {"error": ...} (and logged), not a failed run."""
    from runners.modelaudit import audit_model_forward

    def reporting(fraction: float, message: str) -> None:
        try:
            progress(fraction, message)
        except BaseException as exc:  # the caller stopping us (a cancelled run) is not our failure
            raise _CallerAbort(exc) from exc

    try:
        return audit_model_forward(model_dir, artifact, batch=batch, seq=seq, device=device, profile=profile,
                                   seed=seed, progress=reporting)
    except _CallerAbort as abort:
        raise abort.cause from None
    except Exception as exc:
        # A task's time limit (Celery raises it as an ordinary Exception) must still stop the run.
        if type(exc).__name__ in ("SoftTimeLimitExceeded", "TimeLimitExceeded"):
            raise
        log.exception("end-to-end audit of %s failed", model_dir)
        return {"error": exception_text(exc, limit=2000)}
