"""The contract between the optimizer's search and whoever grades its candidates.

The optimizer proposes `Candidate`s; an `Evaluator` supplied by the runner (runners/evaluate.py)
measures them. The optimizer never times or verifies its own work.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class Candidate:
    """One proposal for one suite workload: a candidate module's source (defines `kernel(*inputs)`)."""

    workload: str
    name: str
    source: str
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def source_sha256(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()


@dataclass(frozen=True)
class Budget:
    """How much measuring one evaluation may spend; quick search evaluations use small budgets."""

    rounds: int = 5
    max_seconds: float = 10.0


@dataclass(frozen=True)
class Measurement:
    """What an evaluator says about a candidate. `median_s` is None when it is not correct."""

    correct: bool
    median_s: float | None
    spread: float | None = None  # relative interquartile range of the samples
    baseline_median_s: float | None = None
    reasons: tuple[str, ...] = ()

    @property
    def speedup(self) -> float | None:
        if not self.correct or not self.median_s or not self.baseline_median_s:
            return None
        return self.baseline_median_s / self.median_s


class Evaluator(Protocol):
    """Implemented by the runner. `shape` and `dtype` come from the suite profile it was built for."""

    def evaluate(self, candidate: Candidate, budget: Budget) -> Measurement: ...
