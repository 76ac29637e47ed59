"""A scripted evaluator for the optimizer's tests: true times per candidate, optional noise that
shrinks with more rounds, candidates judged incorrect or raising, and a log of every call."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from optimizer.evaluation import Budget, Candidate, Measurement


@dataclass
class FakeEvaluator:
    times: dict[str, float]  # candidate name (or name prefix) -> true seconds per call
    default_s: float = 1.0
    incorrect: set[str] = field(default_factory=set)
    raises: set[str] = field(default_factory=set)
    noise: float = 0.0  # relative noise of one round; a measurement's noise is noise / sqrt(rounds)
    seed: int = 0
    seconds_per_round: float = 0.0  # advanced on `clock`, if one is given
    clock: list[float] | None = None
    calls: list[tuple[str, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def true_time(self, name: str) -> float:
        for key in sorted(self.times, key=len, reverse=True):
            if name == key or name.startswith(key + "["):
                return self.times[key]
        return self.default_s

    def evaluate(self, candidate: Candidate, budget: Budget) -> Measurement:
        self.calls.append((candidate.name, budget.rounds))
        if self.clock is not None:
            self.clock[0] += self.seconds_per_round * budget.rounds
        if candidate.name in self.raises:
            raise RuntimeError(f"worker for {candidate.name} died")
        if candidate.name in self.incorrect:
            return Measurement(False, None, reasons=("correctness.mismatch",))
        jitter = 1.0 + self._rng.gauss(0.0, self.noise / budget.rounds**0.5) if self.noise else 1.0
        return Measurement(True, self.true_time(candidate.name) * jitter, spread=self.noise,
                           baseline_median_s=self.true_time("baseline"))


class ScriptedSuiteEvaluator(FakeEvaluator):
    """Built like the runner's SandboxEvaluator, `Cls(spec, device=...)`, for the CLI tests: every
    compiled candidate is twice as fast as the baseline, everything else as fast."""

    def __init__(self, spec: object, *, device: str = "cpu") -> None:
        super().__init__(times={"baseline": 2e-3})
        self.spec = spec
        self.device = device

    def true_time(self, name: str) -> float:
        return 1e-3 if name.startswith("compile-") else 2e-3
