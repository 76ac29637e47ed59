"""The round engine shared by kernel audits (runners.audit.kernel) and whole-model audits
(runners.modelaudit). Trusted side.

One round times every arm once (baseline, candidate or optimized model, the A/A control, reference
points), in an order drawn from a secret source, each window opened only after every process has
gone quiet (`measure.settle`), and records what every other arm's process tree used while one was
measured. After settling, a waiting worker is blocked on its pipe and uses nothing: CPU it spends
in another arm's window is work aimed at that window (stealing its cores, cooling its caches) or
hidden there, and `judge_interference` holds it to the trusted arms' figure.

What differs between the two audits stays with them: what a sample is (a kernel's stepped calls
against shared inputs; a model's forward passes by request), what each round prepares and checks,
and how many rounds they take.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Generic, Protocol as TypingProtocol, Sequence, TypeVar

import numpy as np

from runners import stats, suite
from runners.sandbox import Worker

if TYPE_CHECKING:
    from runners.measure import Protocol


class Arm(TypingProtocol):
    label: str
    worker: Worker


A = TypeVar("A", bound=Arm)
R = TypeVar("R")


class Interference:
    """CPU seconds each arm's tree used while other arms were measured, one value per round."""

    def __init__(self, labels: Sequence[str]) -> None:
        self.per_round: dict[str, list[float]] = {label: [] for label in labels}

    def next_round(self) -> None:
        for values in self.per_round.values():
            values.append(0.0)

    def add(self, label: str, seconds: float) -> None:
        values = self.per_round.setdefault(label, [0.0])
        values[-1] += max(0.0, seconds)

    def rounds(self, selected: Sequence[int]) -> dict[str, list[float]]:
        """The rounds at `selected` indices (the measured ones), per arm."""
        return {label: [values[i] for i in selected if i < len(values)] for label, values in self.per_round.items()}


class Round(Generic[A, R]):
    """One interleaved round over `arms` (a live list: an arm the caller removes mid-round, such
    as a reference point that failed, is no longer counted as another arm's neighbour)."""

    def __init__(self, arms: list[A], *, order: np.random.Generator, settle: Callable[[], object],
                 interference: Interference) -> None:
        self.arms, self.order, self.settle, self.interference = arms, order, settle, interference
        self.measured: list[str] = []  # the last round's labels, in the order they were measured

    def run(self, sample: Callable[[A], R | None]) -> dict[str, R]:
        """`sample(arm)` for every arm in a secret order; the records by label (None: no record)."""
        self.interference.next_round()
        records: dict[str, R] = {}
        self.measured = []
        for arm in [self.arms[int(position)] for position in self.order.permutation(len(self.arms))]:
            if arm not in self.arms:
                continue
            self.measured.append(arm.label)
            self.settle()
            others = [other for other in self.arms if other is not arm]
            before = [other.worker.cpu_ns() for other in others]
            record = sample(arm)
            if record is not None:
                records[arm.label] = record
            for other, start in zip(others, before):
                if other in self.arms:
                    self.interference.add(other.label, (other.worker.cpu_ns() - start) / 1e9)
        return records


def bootstrap_args(protocol: Protocol) -> dict[str, Any]:
    """The bootstrap options of every interval an audit judges on."""
    return {"resamples": protocol.bootstrap_resamples, "confidence": protocol.confidence}


def judge_next_arm(rounds: Sequence[tuple[Sequence[str], dict[str, float]]],
                   protocol: Protocol) -> tuple[tuple[float, float, float] | None, bool]:
    """`next_arm_slowdown` over the rounds, and whether its lower bound is past the protocol's
    tolerance (kernel and whole-model audits word the reason themselves)."""
    found = next_arm_slowdown(rounds, confidence=protocol.confidence)
    return found, found is not None and found[1] > 1.0 + protocol.next_arm_tolerance


def judge_interrupts(candidate: Sequence[float], trusted: Sequence[Sequence[float]], protocol: Protocol, *,
                     seed: int) -> tuple[stats.Estimate | None, bool]:
    """`interrupts_excess`, and whether its lower bound is past the protocol's allowance."""
    est = interrupts_excess(candidate, trusted, seed=suite.derive_seed(seed, "interrupts") & 0xFFFFFFFF, **bootstrap_args(protocol))
    return est, est is not None and est.low > protocol.interrupt_excess_per_ms


def next_arm_slowdown(rounds: Sequence[tuple[Sequence[str], dict[str, float]]], *,
                      confidence: float) -> tuple[float, float, float] | None:
    """How much slower a trusted arm runs when it is measured right after the candidate, from the
    rounds' orders and the two trusted arms' times: the per-round log ratio baseline/A-A in rounds
    where the baseline came right after the candidate, against rounds where the A/A control did.
    Both are the same code, so what differs between the two groups is the neighbour; the
    difference is twice the slowdown of the arm that follows (per arm: its square root). Catches
    whatever a candidate leaves behind for the next window (interrupts, a cold or dirty cache,
    anything not yet imagined). The groups are small (a third of the rounds each), so the
    interval is Welch's t interval, not a bootstrap (runners.stats.welch_difference_ci). None
    with fewer than 3 rounds in either group."""
    after_baseline, after_aa = [], []
    for order, times in rounds:
        if "candidate" not in order or times.get("baseline", 0) <= 0 or times.get("baseline_aa", 0) <= 0:
            continue
        position = list(order).index("candidate")
        follower = order[position + 1] if position + 1 < len(order) else None
        value = float(np.log(times["baseline"] / times["baseline_aa"]))
        if follower == "baseline":
            after_baseline.append(value)
        elif follower == "baseline_aa":
            after_aa.append(value)
    if len(after_baseline) < 3 or len(after_aa) < 3:
        return None
    gap = stats.welch_difference_ci(after_baseline, after_aa, confidence=confidence)
    return float(np.exp(gap.point / 2)), float(np.exp(gap.low / 2)), float(np.exp(gap.high / 2))


def interrupts_excess(candidate: Sequence[float], trusted: Sequence[Sequence[float]], *, resamples: int, confidence: float,
                      seed: int) -> stats.Estimate | None:
    """Interrupts per millisecond on the measurement cores while the trusted arms were measured
    beyond the candidate's own rate, per round: the mean with a bootstrap CI. The mean, not the
    median: interrupts aimed at the arm measured after the candidate miss the rounds in which it is
    measured last. None without rounds to compare."""
    rows = [values for values in trusted if values]
    if not candidate or not rows or any(len(values) != len(candidate) for values in rows):
        return None
    excess = [sum(column) / len(column) - own for own, column in zip(candidate, zip(*rows))]
    return stats.mean_ci(excess, resamples=resamples, confidence=confidence, seed=seed)


def interference_excess(during: Sequence[float], trusted: Sequence[Sequence[float]]) -> float | None:
    """The candidate's mean CPU per round in other arms' windows beyond the trusted arms' mean; None
    without rounds to compare. The mean, not a median's bound: a waiting worker uses no CPU at all,
    and work aimed at other windows misses the rounds in which the candidate is measured last."""
    rows = [values for values in trusted if values]
    if not during or not rows or any(len(values) != len(during) for values in rows):
        return None
    trusted_mean = [sum(column) / len(column) for column in zip(*rows)]
    return sum(c - t for c, t in zip(during, trusted_mean)) / len(during)
