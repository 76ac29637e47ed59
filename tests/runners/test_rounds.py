"""The round engine shared by kernel and whole-model audits: every arm once a round, in a secret
order, each window after settling, and the CPU every other arm used meanwhile."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

from runners.audit.kernel import _judge_interference, _Slot
from runners.audit.outcome import Outcome
from runners.audit.rounds import Interference, Round, interference_excess, next_arm_slowdown
from runners.audit.sample import Sample
from runners.measure import protocol_for
from runners.suite import profile_specs


@dataclass
class _Worker:
    """A worker's CPU counter; `busy` is what it burns while another arm is measured."""

    busy: float = 0.0
    ns: int = 0

    def cpu_ns(self) -> int:
        return self.ns


@dataclass
class _Arm:
    label: str
    worker: _Worker = field(default_factory=_Worker)


def test_every_arm_is_measured_once_a_round_after_settling_in_orders_that_vary():
    arms = [_Arm("baseline"), _Arm("candidate", _Worker(busy=0.003)), _Arm("aa")]
    settled, orders = [], set()
    interference = Interference([a.label for a in arms])
    engine = Round(arms, order=np.random.default_rng(1), settle=lambda: settled.append(1), interference=interference)

    def sample(arm):
        for other in arms:  # while `arm` is measured, the others burn what they burn
            if other is not arm:
                other.worker.ns += int(other.worker.busy * 1e9)
        order.append(arm.label)
        return arm.label.upper()

    for _ in range(12):
        order: list[str] = []
        assert engine.run(sample) == {"baseline": "BASELINE", "candidate": "CANDIDATE", "aa": "AA"}
        orders.add(tuple(order))
    assert len(settled) == 36 and len(orders) > 2
    # Two other arms' windows a round, 3 ms in each: 6 ms; the waiting trusted arms used none.
    assert interference.per_round["candidate"] == [0.006] * 12
    assert interference.per_round["baseline"] == [0.0] * 12
    assert interference_excess(interference.per_round["candidate"],
                               [interference.per_round["baseline"], interference.per_round["aa"]]) == pytest.approx(0.006)
    assert interference_excess([0.001], [[0.0, 0.0]]) is None  # rounds that do not line up compare nothing


def test_an_arm_removed_mid_round_is_not_sampled_or_counted_again():
    arms = [_Arm("baseline"), _Arm("ref:torch-compile"), _Arm("candidate")]
    interference = Interference([a.label for a in arms])
    engine = Round(arms, order=np.random.default_rng(3), settle=lambda: None, interference=interference)

    def sample(arm):
        if arm.label.startswith("ref:"):
            arms.remove(arm)  # a reference point that failed leaves the phase
            return None
        return arm.label

    assert engine.run(sample) == {"baseline": "baseline", "candidate": "candidate"}
    assert engine.run(sample) == {"baseline": "baseline", "candidate": "candidate"}
    assert len(interference.per_round["baseline"]) == 2


def _rounds(candidate_meanwhile: list[float]) -> tuple[list[_Slot], list[dict[str, Sample]]]:
    def sample(meanwhile: float) -> Sample:
        return Sample(calls=4, per_call_s=0.001, window_ns=4_000_000, reported_ns=4_000_000, clock_problem=None,
                      meta=None, pointers=[], inconsistent=[], meanwhile_s=meanwhile)

    trusted = [_Slot("baseline", None), _Slot("baseline_aa", None)]  # type: ignore[arg-type]
    rounds = [{"baseline": sample(0.0), "baseline_aa": sample(0.0001), "candidate": sample(value)}
              for value in candidate_meanwhile]
    return trusted, rounds


def test_cpu_spent_in_other_arms_windows_rejects_beyond_its_allowance_in_audits_that_bill():
    protocol = protocol_for("cpu-ci")
    spec = profile_specs("cpu-ci")[0]
    # Work in two thirds of the rounds (the candidate is measured last in the others): 0.9 ms mean.
    trusted, rounds = _rounds([0.0015, 0.0012, 0.0] * 4)
    outcome, summary = Outcome(spec=spec), {}
    _judge_interference(outcome, summary, trusted, rounds, protocol, checked=True)
    assert [r.code for r in outcome.reasons] == ["integrity.background_cpu"]
    assert "while other arms were measured" in outcome.reasons[0].message
    assert abs(summary["cpu_while_others_measured_extra_s"] - (0.0009 - 0.00005)) < 1e-9
    # Honest: as idle as the trusted workers, within the allowance, or a quick evaluation (not judged).
    for values, checked in (([0.0001] * 12, True), ([0.0004] * 12, True), ([0.003] * 12, False)):
        trusted, rounds = _rounds(values)
        outcome = Outcome(spec=spec)
        _judge_interference(outcome, {}, trusted, rounds, protocol, checked=checked)
        assert outcome.reasons == []


def _rounds_with_a_neighbour_effect(hit: float, seed: int) -> list[tuple[tuple[str, ...], dict[str, float]]]:
    """30 rounds in random orders; the baseline process 4% slower than the A/A control for its
    whole life (a per-process bias), 3% noise, and whichever trusted arm follows the candidate
    slowed by `hit`."""
    rng = np.random.default_rng(seed)
    rounds = []
    for _ in range(30):
        order = tuple(rng.permutation(["baseline", "candidate", "baseline_aa"]))
        times = {"baseline": 1.04, "baseline_aa": 1.0}
        follower = order[order.index("candidate") + 1] if order.index("candidate") < 2 else None
        for label in times:
            times[label] *= float(np.exp(rng.normal(0, 0.03))) * (1 + hit if label == follower else 1.0)
        rounds.append((order, times))
    return rounds


def test_the_arm_after_the_candidate_running_slower_shows_and_a_per_process_bias_does_not():
    for seed in range(5):
        quiet = next_arm_slowdown(_rounds_with_a_neighbour_effect(0.0, seed), confidence=0.95)
        assert quiet is not None and quiet[1] < 1.03 and quiet[1] < 1.0 < quiet[2], quiet
        storm = next_arm_slowdown(_rounds_with_a_neighbour_effect(0.15, seed), confidence=0.95)
        assert storm is not None and storm[1] > 1.03 and storm[1] < 1.15 < storm[2] * 1.02, storm
    # Too few rounds with each trusted arm right after the candidate: no figure.
    assert next_arm_slowdown(_rounds_with_a_neighbour_effect(0.0, 1)[:4], confidence=0.95) is None
