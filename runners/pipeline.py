"""A model run end to end, as a runner executes it: profile -> optimize -> audit -> model figure.

Pure (torch, triton, transformers; no Django): the Celery task calls `run_model_pipeline` and
stores what it returns. The optimizer proposes; the audit here is the harness's, not its own.

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
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runners import suite
from runners.suite import WorkloadSpec

log = logging.getLogger(__name__)

Progress = Callable[[float, str, str], None]  # (fraction of the whole run, message, stage)

# Stage shares of the progress bar: profiling is quick, tuning and auditing take the time.
_PROFILE, _OPTIMIZE, _AUDIT, _END_TO_END = (0.0, 0.1), (0.1, 0.55), (0.55, 0.85), (0.85, 0.97)


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


@dataclass(frozen=True)
class PipelineOutcome:
    inventory: dict[str, Any]
    result: dict[str, Any]
    artifact: dict[str, Any]
    seconds: dict[str, float]


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
                 method=END_TO_END_METHOD, reasons=[])
    return block


def run_model_pipeline(model_dir: Path, *, batch: int, seq: int, profile: str, device: str,
                       tuning_cache: Path, progress: Progress, workload_limit: int = 6,
                       tune_budget_s: float = 20.0, replay: dict[str, Any] | None = None) -> PipelineOutcome:
    """Profile, optimize, audit: the whole measurement of one model run.

    `replay` (a re-audit): the artifact of the run measured before. Nothing is tuned: the same
    suite-workload kernels (its `audited` sources) and the same artifact are measured again on
    this machine, and the outcome carries that artifact verbatim, so the new report is of the
    same artifact (what a deployment is bound to). An older artifact without `audited` sources
    has its workloads tuned again; the artifact itself is still the one replayed."""
    from optimizer.cache import JsonlTuningCache
    from optimizer.model import OptimizationArtifact, optimize_model
    from runners.evaluate import audit_specs
    from runners.fingerprint import environment_fingerprint
    from runners.optimized import hardware_label, tune_specs
    from runners.profile import profile_model

    def part(span: tuple[float, float], stage: str) -> Callable[[float, str], None]:
        return lambda f, m: progress(span[0] + (span[1] - span[0]) * f, m, stage)

    seconds: dict[str, float] = {}
    started = time.monotonic()
    inventory = profile_model(model_dir, batch=batch, seq=seq, device=device, progress=part(_PROFILE, "profile"))
    seconds["profile"] = time.monotonic() - started

    replayed = dict((replay or {}).get("audited") or {})
    if replayed:
        planned, unsupported = _replay_plan(inventory, profile=profile, audited=replayed)
    else:
        planned, unsupported = plan_workloads(inventory, profile=profile, limit=workload_limit)
    timing = inventory.get("instrumented_time_s") or {}
    total = float(timing.get("classified", 0.0)) + float(timing.get("unclassified", 0.0))
    hardware = hardware_label(environment_fingerprint(device))
    optimize = part(_OPTIMIZE, "optimize")
    tuned_share = len(planned) / (len(planned) + 1)  # the last slot of the stage is the artifact's
    started = time.monotonic()
    if replayed:
        sources = {w.key: replayed[w.key] for w in planned}
        tuning = [{"key": w.key, "candidate": "replayed from the re-audited run's artifact", "cache_hit": False,
                   "seconds": 0.0, "trials": 0} for w in planned]
    else:
        sources, records = tune_specs([w.spec for w in planned], device=device, cache_path=tuning_cache,
                                      budget_s=tune_budget_s, hardware=hardware,
                                      progress=lambda f, m: optimize(f * tuned_share, m))
        tuning = [{"key": r.key, "candidate": r.candidate, "cache_hit": r.cache_hit, "seconds": r.seconds,
                   "trials": r.trials} for r in records]
    if replay is not None:
        artifact = OptimizationArtifact.from_dict(replay)
        optimize(1.0, f"re-audit: replaying the artifact measured before (strategy {artifact.strategy})")
    else:
        artifact = optimize_model(model_dir, batch=batch, seq=seq, device=device,
                                  cache=JsonlTuningCache(tuning_cache), hardware=hardware)
        artifact.audited = {w.key: sources[w.key] for w in planned}
        optimize(1.0, f"optimization artifact: strategy {artifact.strategy}")
    seconds["optimize"] = time.monotonic() - started

    started = time.monotonic()
    result = audit_specs([w.spec for w in planned], [sources[w.key] for w in planned], keys=[w.key for w in planned],
                         profile=profile, device=device, progress=part(_AUDIT, "audit"), label="dyno optimizer")
    seconds["audit"] = time.monotonic() - started
    amdahl = model_figure(result["workloads"], planned, total, unsupported)
    started = time.monotonic()
    end_to_end = end_to_end_audit(
        model_dir, artifact, batch=batch, seq=seq, device=device, profile=profile,
        seed=int((result.get("protocol") or {}).get("seed") or secrets.randbits(62)), progress=part(_END_TO_END, "audit"))
    seconds["end_to_end"] = time.monotonic() - started
    result["model"] = billed_model_block(amdahl, end_to_end)
    result["model"]["shape"] = {"batch": batch, "seq": seq}
    result["optimization"] = {"tuning": tuning, "seconds": seconds, "replayed": replay is not None,
                              # `suite --artifact` can re-audit them: the billed figure reproduces.
                              "kernels_in_artifact": bool(replayed) or replay is None}
    # A replay hands back the artifact it was given, byte for byte once canonical: same artifact, same hash.
    stored = dict(replay) if replay is not None else artifact.to_dict()
    return PipelineOutcome(inventory=inventory, result=result, artifact=stored, seconds=seconds)


def _replay_plan(inventory: dict[str, Any], *, profile: str,
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
        return {"error": f"{type(exc).__name__}: {exc}"[:2000]}
