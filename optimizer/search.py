"""Tuning search: spends a time budget on a family's candidates through the runner's evaluator.

Small spaces are measured exhaustively; large ones by successive halving (every candidate gets a
quick, noisy measurement, the faster part gets more rounds). The baseline runs in every rung, an
incorrect candidate is dropped at once, and every trial is recorded with its verdict and reasons.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from optimizer.cache import TuningCache, TuningEntry, TuningKey, make_key
from optimizer.candidates import (
    call_floor_s,
    candidate_space,
    check_shape,
    family_constants,
    render_candidate,
    resolve_family,
    variant_from_params,
)
from optimizer.evaluation import Budget, Candidate, Evaluator, Measurement

log = logging.getLogger(__name__)

# Spaces up to this size are measured exhaustively at the full budget; beyond it a quick
# first rung pays for itself (an 8-candidate exhaustive run at 10 rounds costs what halving
# spends on ~20 candidates).
EXHAUSTIVE_MAX = 6
QUICK_ROUNDS = 3
FULL_ROUNDS = 10
HALVING_ETA = 2
# A candidate must beat the baseline's median by this much to be chosen: below it the pick is
# within the noise of a quick search and the baseline is the safer answer.
MIN_GAIN = 0.03


class Verdict:
    CORRECT = "correct"
    INCORRECT = "incorrect"
    ERROR = "error"
    SKIPPED = "skipped"


class SearchNote:
    """Machine-readable reason codes the search adds to a trial (the evaluator adds its own)."""

    EVALUATOR_RAISED = "evaluator-raised"
    BUDGET_EXHAUSTED = "budget-exhausted"
    ELIMINATED = "eliminated"
    BASELINE_REJECTED = "baseline-rejected"
    NOT_FASTER = "not-faster-than-baseline"
    FLOOR_ABOVE_BASELINE = "call-floor-above-baseline"


@dataclass(frozen=True)
class Trial:
    """One evaluation of one candidate (or the record that it was skipped)."""

    candidate: str
    params: dict[str, Any]
    source_sha256: str
    rung: int
    rounds: int
    verdict: str
    median_s: float | None = None
    spread: float | None = None
    speedup: float | None = None
    reasons: tuple[str, ...] = ()
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["reasons"] = list(self.reasons)
        return out


@dataclass
class TuningResult:
    """What tune_workload returns: the chosen candidate, every trial, and what it cost."""

    workload: str
    family: str
    shape: dict[str, int]
    dtype: str
    device: str
    chosen: Candidate
    trials: list[Trial]
    cache_hit: bool
    seconds_spent: float
    strategy: str
    speedup_estimate: float | None = None
    cache_key: str | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "workload": self.workload,
            "family": self.family,
            "shape": dict(self.shape),
            "dtype": self.dtype,
            "device": self.device,
            "chosen": {
                "name": self.chosen.name,
                "params": self.chosen.params,
                "source_sha256": self.chosen.source_sha256,
                "source": self.chosen.source,
            },
            "speedup_estimate": self.speedup_estimate,
            "trials": [t.to_dict() for t in self.trials],
            "cache_hit": self.cache_hit,
            "cache_key": self.cache_key,
            "seconds_spent": self.seconds_spent,
            "strategy": self.strategy,
            "notes": list(self.notes),
        }


@dataclass
class _Contender:
    candidate: Candidate
    is_baseline: bool
    last: Measurement | None = None


@dataclass
class SearchOutcome:
    chosen: Candidate
    trials: list[Trial]
    strategy: str
    speedup_estimate: float | None
    notes: list[str]


class _Clock:
    def __init__(self, budget_s: float, now: Callable[[], float]) -> None:
        self.now = now
        self.start = now()
        self.budget_s = budget_s

    def left(self) -> float:
        return self.budget_s - (self.now() - self.start)


def _evaluate(evaluator: Evaluator, c: _Contender, rung: int, rounds: int, clock: _Clock) -> Trial:
    # The whole remaining budget: a torch.compile candidate spends tens of seconds compiling in a
    # cold sandbox before its first round, and cutting it off would reject it for being slow to build.
    budget = Budget(rounds=rounds, max_seconds=max(5.0, clock.left()))
    started = clock.now()
    try:
        m = evaluator.evaluate(c.candidate, budget)
    except Exception as exc:  # a broken evaluator call rejects this candidate, not the run
        c.last = None
        return Trial(c.candidate.name, c.candidate.params, c.candidate.source_sha256, rung, rounds, Verdict.ERROR,
                     reasons=(SearchNote.EVALUATOR_RAISED, f"{type(exc).__name__}: {exc}"),
                     seconds=clock.now() - started)
    elapsed = clock.now() - started
    c.last = m
    correct = bool(m.correct and m.median_s)
    verdict = Verdict.CORRECT if correct else Verdict.INCORRECT
    return Trial(c.candidate.name, c.candidate.params, c.candidate.source_sha256, rung, rounds, verdict,
                 median_s=m.median_s if correct else None, spread=m.spread, speedup=m.speedup,
                 reasons=tuple(m.reasons), seconds=elapsed)


def _speedup(c: _Contender, baseline: _Contender | None) -> float | None:
    """Speedup over the baseline: the evaluator's paired figure when it gives one, else the ratio
    of this rung's medians."""
    m = c.last
    if m is None or not m.correct or not m.median_s:
        return None
    if m.speedup is not None:
        return m.speedup
    if baseline is not None and baseline.last is not None and baseline.last.correct and baseline.last.median_s:
        return baseline.last.median_s / m.median_s
    return None


def search(
    candidates: list[Candidate],
    evaluator: Evaluator,
    *,
    time_budget_s: float,
    exhaustive_max: int = EXHAUSTIVE_MAX,
    quick_rounds: int = QUICK_ROUNDS,
    full_rounds: int = FULL_ROUNDS,
    eta: int = HALVING_ETA,
    min_gain: float = MIN_GAIN,
    now: Callable[[], float] = time.monotonic,
    floor_s: Callable[[Candidate], float] | None = None,
) -> SearchOutcome:
    """Pick the fastest verified candidate; candidates[0] must be the baseline, and it is what is
    chosen unless another candidate beats it by `min_gain` in the same rung.

    `floor_s` gives the least a call of a candidate can take; one whose floor is not below the
    baseline's measured median cannot win and is skipped unmeasured."""
    if not candidates:
        raise ValueError("search needs at least the baseline candidate")
    clock = _Clock(time_budget_s, now)
    contenders = [_Contender(c, is_baseline=(i == 0)) for i, c in enumerate(candidates)]
    baseline = contenders[0]
    trials: list[Trial] = []
    notes: list[str] = []
    exhaustive = len(contenders) <= exhaustive_max
    strategy = "exhaustive" if exhaustive else "successive-halving"
    rounds = full_rounds if exhaustive else min(quick_rounds, full_rounds)

    def measure(group: list[_Contender], rung: int, rounds: int) -> list[_Contender]:
        measured = []
        for i, c in enumerate(group):
            if clock.left() <= 0 and not c.is_baseline:
                trials.extend(Trial(s.candidate.name, s.candidate.params, s.candidate.source_sha256, rung, rounds,
                                    Verdict.SKIPPED, reasons=(SearchNote.BUDGET_EXHAUSTED,))
                              for s in group[i:] if not s.is_baseline)
                break
            floor = floor_s(c.candidate) if floor_s is not None and not c.is_baseline else 0.0
            base_s = baseline.last.median_s if baseline.last is not None and baseline.last.correct else None
            if floor and base_s and floor >= base_s:
                trials.append(Trial(c.candidate.name, c.candidate.params, c.candidate.source_sha256, rung, rounds,
                                    Verdict.SKIPPED, reasons=(SearchNote.FLOOR_ABOVE_BASELINE,
                                                              f"floor {floor:.3g} s >= baseline {base_s:.3g} s")))
                continue
            trial = _evaluate(evaluator, c, rung, rounds, clock)
            trials.append(trial)
            if trial.verdict == Verdict.CORRECT:
                measured.append(c)
            elif c.is_baseline and not any(n.startswith(SearchNote.BASELINE_REJECTED) for n in notes):
                notes.append(f"{SearchNote.BASELINE_REJECTED}: the baseline candidate was judged {trial.verdict} "
                             f"({'; '.join(trial.reasons)}); speedups rely on the evaluator's own baseline")
        return measured

    rung = 0
    alive = contenders
    while True:
        last_rung = measure(alive, rung, rounds)
        others = [c for c in last_rung if not c.is_baseline]
        if rounds >= full_rounds or clock.left() <= 0:
            break
        if len(others) <= 1:
            # One survivor: confirm it against the baseline at full precision, then stop.
            if others:
                last_rung = measure([baseline, *others], rung + 1, full_rounds)
            break
        # Rank by the paired speedup where the evaluator gives one (load on a shared box hits both
        # sides of a pair alike), else by the median.
        ranked = sorted(others, key=lambda c: (-(_speedup(c, baseline) or 0.0), c.last.median_s))  # type: ignore[union-attr]
        keep = max(1, math.ceil(len(ranked) / eta))
        trials.extend(Trial(d.candidate.name, d.candidate.params, d.candidate.source_sha256, rung, rounds,
                            Verdict.SKIPPED, median_s=d.last.median_s,  # type: ignore[union-attr]
                            reasons=(SearchNote.ELIMINATED,)) for d in ranked[keep:])
        alive = [baseline, *ranked[:keep]]
        rung += 1
        rounds = min(full_rounds, rounds * eta)

    base_in_rung = baseline if baseline in last_rung else None
    best: _Contender | None = None
    best_speedup = 1.0 + min_gain
    for c in last_rung:
        if c.is_baseline:
            continue
        s = _speedup(c, base_in_rung)
        if s is not None and s >= best_speedup:
            best, best_speedup = c, s
    if best is None:
        notes.append(f"{SearchNote.NOT_FASTER}: no candidate beat the baseline by {min_gain:.0%} in the final rung")
        return SearchOutcome(baseline.candidate, trials, strategy, 1.0 if base_in_rung else None, notes)
    return SearchOutcome(best.candidate, trials, strategy, best_speedup, notes)


def default_hardware() -> str:
    """A coarse fingerprint for callers that pass none: device name or CPU model, and core count.
    The runner passes its audited environment fingerprint instead."""
    import os
    import platform

    import torch

    if torch.cuda.is_available():
        return f"cuda:{torch.cuda.get_device_name(0)}"
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"cpu:{model}:{os.cpu_count()}cores"


def tune_workload(
    spec_name: str,
    family: str,
    shape: dict[str, int],
    dtype: str,
    evaluator: Evaluator,
    *,
    device: str,
    cache: TuningCache | None = None,
    time_budget_s: float = 60.0,
    hardware: str | None = None,
    constants: dict[str, Any] | None = None,
    now: Callable[[], float] = time.monotonic,
) -> TuningResult:
    """Tune one suite workload: a warm cache entry for its shape bucket answers at once; otherwise
    search the family's space on `device` through `evaluator` and record the pick in the cache.

    `family` is the optimizer's kernel family (= the suite workload name, e.g. "rmsnorm"); the
    suite's category names ("normalization", ...) are accepted and resolved through `spec_name`.
    `hardware` is the caller's environment fingerprint (default: a coarse local one);
    `constants` overrides baked-in constants such as EPS.
    """
    family = resolve_family(spec_name, family)
    check_shape(family, shape)
    started = now()
    consts = family_constants(family, shape, constants)
    key = make_key(family, shape, dtype, hardware=hardware or default_hardware(), device=device)
    if cache is not None:
        entry = cache.get(key)
        chosen = None
        if entry is not None:
            try:
                chosen = render_candidate(spec_name, family, variant_from_params(entry.params), constants=consts)
            except (KeyError, ValueError) as exc:  # an entry this code can no longer render is a miss
                log.warning("tuning cache entry for %s no longer renders (%s); searching again", spec_name, exc)
        if chosen is not None and entry is not None:
            return TuningResult(spec_name, family, dict(shape), dtype, device, chosen, [], True, now() - started,
                                "cache", entry.speedup_estimate, key.digest(),
                                [f"cache hit: tuned for shape {entry.shape} in {entry.tuning_seconds:.1f}s"])
    candidates = candidate_space(spec_name, family, shape, dtype, device, constants=consts)
    outcome = search(candidates, evaluator, time_budget_s=time_budget_s, now=now,
                     floor_s=lambda c: call_floor_s(c, device))
    spent = now() - started
    result = TuningResult(spec_name, family, dict(shape), dtype, device, outcome.chosen, outcome.trials, False, spent,
                          outcome.strategy, outcome.speedup_estimate, key.digest(), outcome.notes)
    if cache is not None:
        cache.put(key, TuningEntry(
            params=dict(outcome.chosen.params), candidate=outcome.chosen.name,
            source_sha256=outcome.chosen.source_sha256, shape=dict(shape),
            speedup_estimate=outcome.speedup_estimate, tuning_seconds=spent,
        ))
    return result


__all__ = ["SearchNote", "SearchOutcome", "Trial", "TuningKey", "TuningResult", "Verdict", "search", "tune_workload"]
