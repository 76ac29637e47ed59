"""A model run end to end, as a runner executes it: profile -> optimize -> audit -> model figure.

Pure (torch, triton, transformers; no Django): the Celery task calls `run_model_pipeline` and
stores what it returns. The optimizer proposes; the figures are the judge's (runners.modelplan:
the Amdahl diagnostic and the end-to-end figure that bills).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optimizer.model
from optimizer.cache import JsonlTuningCache
from optimizer.model import OptimizationArtifact
from pipeline import optimized
from runners import evaluate, measure, modelplan
from runners import inventory as inventories
from runners.fingerprint import environment_fingerprint

Progress = Callable[[float, str, str], None]  # (fraction of the whole run, message, stage)

# Stage shares of the progress bar: profiling is quick, tuning and auditing take the time.
_PROFILE, _OPTIMIZE, _AUDIT, _END_TO_END = (0.0, 0.1), (0.1, 0.55), (0.55, 0.85), (0.85, 0.97)


@dataclass(frozen=True)
class PipelineOutcome:
    inventory: dict[str, Any]
    result: dict[str, Any]
    artifact: dict[str, Any]
    seconds: dict[str, float]




def unknown_compile_variants(names: Sequence[str]) -> str | None:
    """What is wrong with a list of the optimizer's compile variant names, or None."""
    try:
        optimizer.model.compile_variants(names)
    except ValueError as exc:
        return str(exc)
    return None


def run_model_pipeline(model_dir: Path, *, batch: int, seq: int, profile: str, device: str,
                       tuning_cache: Path, progress: Progress, workload_limit: int = 6,
                       tune_budget_s: float = 20.0, replay: dict[str, Any] | None = None,
                       try_compile: bool = True, compile_variants: Sequence[str] | None = None) -> PipelineOutcome:
    """Profile, optimize, audit: the whole measurement of one model run.

    `replay` (a re-audit): the artifact of the run measured before. Nothing is tuned: the same
    suite-workload kernels (its `audited` sources) and the same artifact are measured again on
    this machine, and the outcome carries that artifact verbatim, so the new report is of the
    same artifact (what a deployment is bound to). An older artifact without `audited` sources
    has its workloads tuned again; the artifact itself is still the one replayed."""
    def part(span: tuple[float, float], stage: str) -> Callable[[float, str], None]:
        return lambda f, m: progress(span[0] + (span[1] - span[0]) * f, m, stage)

    seconds: dict[str, float] = {}
    started = time.monotonic()
    inventory = inventories.take_inventory(model_dir, batch=batch, seq=seq, device=device, progress=part(_PROFILE, "profile"))
    seconds["profile"] = time.monotonic() - started

    replayed = dict((replay or {}).get("audited") or {})
    if replayed:
        planned, unsupported = modelplan.replay_plan(inventory, profile=profile, audited=replayed)
    else:
        planned, unsupported = modelplan.plan_workloads(inventory, profile=profile, limit=workload_limit)
    timing = inventory.get("instrumented_time_s") or {}
    total = float(timing.get("classified", 0.0)) + float(timing.get("unclassified", 0.0))
    hardware = optimized.hardware_label(environment_fingerprint(device))
    optimize = part(_OPTIMIZE, "optimize")
    tuned_share = len(planned) / (len(planned) + 1)  # the last slot of the stage is the artifact's
    started = time.monotonic()
    if replayed:
        sources = {w.key: replayed[w.key] for w in planned}
        tuning = [{"key": w.key, "candidate": "replayed from the re-audited run's artifact", "cache_hit": False,
                   "seconds": 0.0, "trials": 0} for w in planned]
    else:
        sources, records = optimized.tune_specs([w.spec for w in planned], device=device, cache_path=tuning_cache,
                                      budget_s=tune_budget_s, hardware=hardware,
                                      progress=lambda f, m: optimize(f * tuned_share, m))
        tuning = [{"key": r.key, "candidate": r.candidate, "cache_hit": r.cache_hit, "seconds": r.seconds,
                   "trials": r.trials} for r in records]
    if replay is not None:
        artifact = OptimizationArtifact.from_dict(replay)
        optimize(1.0, f"re-audit: replaying the artifact measured before (strategy {artifact.strategy})")
    else:
        # Estimated at the thread count the end-to-end audit's workers run at.
        artifact = optimizer.model.optimize_model(model_dir, batch=batch, seq=seq, device=device,
                                  cache=JsonlTuningCache(tuning_cache), hardware=hardware, try_compile=try_compile,
                                  variants=compile_variants, threads=measure.protocol_for(profile).worker_threads())
        artifact.audited = {w.key: sources[w.key] for w in planned}
        optimize(1.0, f"optimization artifact: strategy {artifact.strategy}")
    seconds["optimize"] = time.monotonic() - started

    started = time.monotonic()
    result = evaluate.audit_specs([w.spec for w in planned], [sources[w.key] for w in planned], keys=[w.key for w in planned],
                         profile=profile, device=device, progress=part(_AUDIT, "audit"), label="dyno optimizer")
    seconds["audit"] = time.monotonic() - started
    amdahl = modelplan.model_figure(result["workloads"], planned, total, unsupported)
    started = time.monotonic()
    end_to_end = modelplan.end_to_end_audit(
        model_dir, artifact, batch=batch, seq=seq, device=device, profile=profile,
        seed=int((result.get("protocol") or {}).get("seed") or secrets.randbits(62)), progress=part(_END_TO_END, "audit"))
    seconds["end_to_end"] = time.monotonic() - started
    result["model"] = modelplan.billed_model_block(amdahl, end_to_end)
    result["model"]["shape"] = {"batch": batch, "seq": seq}
    result["optimization"] = {"tuning": tuning, "seconds": seconds, "replayed": replay is not None,
                              # `suite --artifact` can re-audit them: the billed figure reproduces.
                              "kernels_in_artifact": bool(replayed) or replay is None}
    # A replay hands back the artifact it was given, byte for byte once canonical: same artifact, same hash.
    stored = dict(replay) if replay is not None else artifact.to_dict()
    return PipelineOutcome(inventory=inventory, result=result, artifact=stored, seconds=seconds)
