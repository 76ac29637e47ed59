"""The optimized suite: tune every workload of a profile (tuning cache first), then audit the picks.

Pure (torch; no Django). The optimizer proposes through a sandboxed evaluator; the numbers that
count come from the harness's own full audit of the chosen sources, as for any third party.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from optimizer.cache import JsonlTuningCache
from optimizer.search import tune_workload
from pipeline.evaluator import SandboxEvaluator
from runners import result, suite
from runners.evaluate import HarnessError, audit_specs, run_suite
from runners.fingerprint import environment_fingerprint
from runners.suite import WorkloadSpec

Progress = Callable[[float, str], None]  # (fraction of the tuning, message), as the harness's own

# Share of the progress bar the tuning takes; the audit has the rest. A warm cache makes the
# tuning near-instant, a cold one dominates: half is the honest middle.
_TUNE_SHARE = 0.5


@dataclass(frozen=True)
class TuningRecord:
    """What the optimizer chose for one workload and what choosing it cost."""

    key: str
    workload: str
    candidate: str
    source_sha256: str
    cache_hit: bool
    seconds: float
    trials: int
    strategy: str
    speedup_estimate: float | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "workload": self.workload,
            "candidate": self.candidate,
            "source_sha256": self.source_sha256,
            "cache_hit": self.cache_hit,
            "seconds": self.seconds,
            "trials": self.trials,
            "strategy": self.strategy,
            "speedup_estimate": self.speedup_estimate,
        }


def hardware_label(fingerprint: dict[str, Any]) -> str:
    """The tuning cache's hardware key, for suite runs and model runs alike, so both share their
    tuning decisions on the same runner."""
    return f"{fingerprint.get('device_name')}:{fingerprint.get('cpu_model')}:{fingerprint.get('threads')}t"


def selected_specs(profile: str, workloads: Sequence[str] | None = None) -> list[WorkloadSpec]:
    """The profile's specs in profile order, limited to `workloads` when given (ValueError names
    the valid workloads for an unknown one)."""
    names = list(workloads or [])
    for name in names:
        suite.find_spec(profile, name)
    return [spec for spec in suite.profile_specs(profile) if not names or spec.name in names]


def tune_specs(
    specs: Sequence[WorkloadSpec],
    *,
    device: str,
    cache_path: Path,
    budget_s: float,
    hardware: str | None = None,
    progress: Progress | None = None,
) -> tuple[dict[str, str], list[TuningRecord]]:
    """Tune each spec through a `SandboxEvaluator`: a warm cache entry for its shape bucket
    answers without a search. Returns the chosen sources by spec key, and one record per spec.

    `hardware` is the cache's hardware key (default: this runner's `hardware_label`), for a caller
    that uses the same key again after tuning."""
    if budget_s <= 0:
        raise ValueError(f"the tuning budget must be positive, got {budget_s} s")
    cache = JsonlTuningCache(cache_path)
    hardware = hardware or hardware_label(environment_fingerprint(device))
    sources: dict[str, str] = {}
    records: list[TuningRecord] = []
    for index, spec in enumerate(specs):
        if progress is not None:
            progress(index / max(1, len(specs)), f"tuning {spec.key}")
        with SandboxEvaluator(spec, device=device) as evaluator:
            tuned = tune_workload(spec.name, spec.family, spec.shape, spec.dtype, evaluator,
                                  device=device, cache=cache, time_budget_s=budget_s, hardware=hardware)
        sources[spec.key] = tuned.chosen.source
        record = TuningRecord(
            key=spec.key, workload=spec.name, candidate=tuned.chosen.name,
            source_sha256=tuned.chosen.source_sha256, cache_hit=tuned.cache_hit,
            seconds=tuned.seconds_spent, trials=len(tuned.trials), strategy=tuned.strategy,
            speedup_estimate=tuned.speedup_estimate,
        )
        records.append(record)
        if progress is not None:
            how = "cache hit" if record.cache_hit else f"{record.trials} trials in {record.seconds:.1f} s"
            progress((index + 1) / max(1, len(specs)), f"{spec.key}: chose {record.candidate} ({how})")
    return sources, records


def run_optimized_suite(
    profile: str,
    *,
    workloads: Sequence[str] | None = None,
    device: str | None = None,
    cache_path: Path,
    budget_s: float,
    seed: int | None = None,
    reference_points: Sequence[str] = (),
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Tune then audit `profile` (or its `workloads`); the suite document gains `optimization`
    with each tuning record and the seconds tuning and auditing took."""
    if profile not in suite.profile_names():
        raise HarnessError(f"unknown profile {profile!r}; use one of {', '.join(suite.profile_names())}")
    device = device or suite.profile_device(profile)
    specs = selected_specs(profile, workloads)

    def part(start: float, end: float) -> Progress | None:
        if progress is None:
            return None
        return lambda fraction, message: progress(start + (end - start) * fraction, message)

    started = time.monotonic()
    sources, records = tune_specs(specs, device=device, cache_path=cache_path, budget_s=budget_s,
                                  progress=part(0.0, _TUNE_SHARE))
    tune_s = time.monotonic() - started
    started = time.monotonic()
    names = [spec.name for spec in specs]
    if len(set(names)) == len(names):
        # One shape per workload (the CPU profiles): the ordinary suite run, its manifest and all.
        document = run_suite(profile, workloads=names, candidate_sources={s.name: sources[s.key] for s in specs},
                             device=device, seed=seed, progress=part(_TUNE_SHARE, 1.0),
                             reference_points=reference_points)
    else:
        # A workload at several shapes (the gpu profile): run_suite takes one source per name, so
        # each shape's own pick is audited by key.
        document = audit_specs(specs, [sources[s.key] for s in specs], keys=[s.key for s in specs],
                               profile=profile, device=device, seed=seed, progress=part(_TUNE_SHARE, 1.0),
                               reference_points=reference_points)
    document["optimization"] = {
        "optimizer": "dyno optimizer",
        "tuning_cache": str(cache_path),
        "budget_s": budget_s,
        "tuning": [r.to_dict() for r in records],
        "seconds": {"tune": tune_s, "audit": time.monotonic() - started},
    }
    result.validate_document(document)
    return document
