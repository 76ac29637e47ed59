"""Worker generations: every arm measured by several successive fresh processes, the CI resampling
them as clusters, and every new candidate process checked before it is timed."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from runners import measure, stats, suite
from runners.audit.kernel import round_schedule
from runners.evaluate import AuditSession, audit_candidate
from runners.sandbox import SandboxConfig


def test_it_shares_the_measured_rounds_among_generations_each_led_by_its_own_warm_up():
    protocol = replace(measure.protocol_for("cpu"), rounds=30, warmup_rounds=1, worker_generations=6)
    schedule = round_schedule(protocol)
    assert len(schedule) == 36
    for generation in range(6):
        rounds = [warmup for g, warmup in schedule if g == generation]
        assert rounds == [True] + [False] * 5
    assert [g for g, _ in schedule] == sorted(g for g, _ in schedule)  # one generation after another

    uneven = round_schedule(replace(protocol, rounds=8, worker_generations=3, warmup_rounds=2))
    assert [sum(1 for g, w in uneven if g == n and not w) for n in range(3)] == [3, 3, 2]
    assert sum(1 for _, w in uneven if w) == 6
    # Never more generations than measured rounds; a budget-cut evaluation keeps one process.
    assert {g for g, _ in round_schedule(replace(protocol, rounds=2, worker_generations=6))} == {0, 1}
    assert {g for g, _ in round_schedule(protocol, budget_cut=True)} == {0}
    assert len(round_schedule(protocol, budget_cut=True)) == 31


def _biased_rounds(rng: np.random.Generator, clusters: int, per: int, spread: float) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """Identical arms, except that every process pair carries its own lasting bias."""
    bias = np.repeat(rng.lognormal(0.0, spread, clusters), per)
    base = rng.lognormal(0.0, 0.005, clusters * per)
    other = base * bias * rng.lognormal(0.0, 0.005, clusters * per)
    return base, other, [c for c in range(clusters) for _ in range(per)]


def test_the_clustered_interval_carries_a_bias_that_stays_with_each_process():
    rng = np.random.default_rng(3)
    plain = clustered = 0
    trials = 120
    for trial in range(trials):
        base, other, labels = _biased_rounds(rng, 6, 5, 0.04)
        rounds_only = stats.paired_ratio_ci(base, other, seed=trial, resamples=400)
        plain += rounds_only.low <= 1.0 <= rounds_only.high
        estimate = stats.paired_ratio_ci(base, other, seed=trial, resamples=400, clusters=labels)
        clustered += estimate.low <= 1.0 <= estimate.high
    # Rounds alone see 1% noise and miss a 4%-per-process bias most of the time; resampling the
    # processes keeps the interval honest (a percentile bootstrap over 6 clusters is a little
    # narrow, hence not the nominal 95%).
    assert plain < trials * 0.6
    assert clustered >= trials * 0.8


def test_the_clustered_interval_is_deterministic_and_reduces_to_the_plain_one_for_one_process():
    rng = np.random.default_rng(4)
    base, other, labels = _biased_rounds(rng, 4, 6, 0.03)
    first = stats.paired_ratio_ci(base, other, seed=9, clusters=labels)
    assert first == stats.paired_ratio_ci(base, other, seed=9, clusters=labels)
    assert first.point == pytest.approx(float(np.median(base / other)))
    assert stats.paired_ratio_ci(base, other, seed=9, clusters=[0] * len(labels)) == stats.paired_ratio_ci(base, other, seed=9)
    with pytest.raises(ValueError):
        stats.paired_ratio_ci(base, other, clusters=labels[:-1])


# A short protocol with three generations: two measured rounds each, no caching probe (two probe
# rounds are too few to judge on: an honest baseline was once flagged).
ROTATING = replace(
    measure.protocol_for("cpu-ci"), rounds=6, worker_generations=3, probe_rounds=0, revalidate_sets=1,
    load_timeout_s=20.0, first_call_timeout_s=20.0, call_timeout_floor_s=10.0,
)


@pytest.fixture(scope="module")
def session():
    with AuditSession(device="cpu", config=SandboxConfig(device="cpu", threads=1)) as shared:
        yield shared


@pytest.fixture
def spawned(session, monkeypatch):
    roles: list[tuple[str, int]] = []
    spawn = session.sandbox.spawn

    def recording(role: str):
        worker = spawn(role)
        roles.append((role, worker.pid))
        return worker

    monkeypatch.setattr(session.sandbox, "spawn", recording)
    return roles


def test_it_measures_every_arm_with_fresh_processes_each_generation(session, spawned):
    spec = suite.find_spec("cpu-ci", "rmsnorm")[0]
    document = audit_candidate("rmsnorm", suite.baseline_source(spec), profile="cpu-ci", seed=21, protocol=ROTATING, session=session)
    entry = document["workloads"][0]
    assert document["verdict"] == "accepted", entry["reasons"]
    assert entry["timing"]["worker_generations"] == 3 and entry["timing"]["rounds"] == 6
    candidates = [pid for role, pid in spawned if role == "candidate"]
    baselines = [pid for role, pid in spawned if role == "baseline"]
    assert len(set(candidates)) >= 3  # one per generation (references may add their own)
    assert len(set(baselines)) >= 4  # baseline and A/A control renewed twice
    assert entry["aa"]["ci95"] is not None and entry["ci95"] is not None


def test_a_candidate_process_that_turns_wrong_in_a_later_generation_is_caught(session, spawned, monkeypatch):
    """A candidate's behaviour may differ from one process to the next (it may decide at import
    time, from anything it can see): each new candidate process passes a check before it is
    timed, and is challenged every round like the first one."""
    spec = suite.find_spec("cpu-ci", "rmsnorm")[0]
    honest = suite.baseline_source(spec)
    wrong = honest + "\n\n_inner = kernel\n\n\ndef kernel(*inputs):\n    return _inner(*inputs) * 1.01\n"
    loads: list[str] = []
    load = session.load

    def second_process_differs(worker, spec_, source, protocol, *, label):
        if label == "candidate":
            loads.append(label)
            if len(loads) > 1:
                source = wrong
        return load(worker, spec_, source, protocol, label=label)

    monkeypatch.setattr(session, "load", second_process_differs)
    document = audit_candidate("rmsnorm", honest, profile="cpu-ci", seed=22, protocol=ROTATING, session=session)
    codes = {reason["code"] for reason in document["workloads"][0]["reasons"]}
    assert document["verdict"] == "rejected" and "correctness.mismatch" in codes, codes
    assert len(loads) == 2  # the first wrong process ended the audit


def test_a_noisy_aa_control_earns_more_rounds_up_to_the_cap_and_nothing_else_does():
    import numpy as np
    from types import SimpleNamespace

    from runners.audit.kernel import _Slot, extra_rounds

    cpu = measure.protocol_for("cpu")
    rng = np.random.default_rng(3)

    def slots(rounds: int, noise: float) -> list:
        base = [SimpleNamespace(per_call_s=1e-3 * (1 + noise * rng.standard_normal())) for _ in range(rounds)]
        aa = [SimpleNamespace(per_call_s=1e-3 * (1 + noise * rng.standard_normal())) for _ in range(rounds)]
        # The candidate's samples are wildly noisy on purpose: the rule must not read them.
        candidate = [SimpleNamespace(per_call_s=1e-3 * (1 + rng.random())) for _ in range(rounds)]
        return [_Slot("baseline", None, base), _Slot("candidate", None, candidate), _Slot("baseline_aa", None, aa)]

    assert extra_rounds(cpu, slots(30, 0.15), measured=30, seed=1) == cpu.extend_rounds
    assert extra_rounds(cpu, slots(85, 0.15), measured=85, seed=1) == 5  # never past max_rounds_factor x rounds
    assert extra_rounds(cpu, slots(90, 0.15), measured=90, seed=1) == 0
    assert extra_rounds(cpu, slots(30, 0.005), measured=30, seed=1) == 0  # tight enough already
    assert extra_rounds(measure.protocol_for("cpu-ci"), slots(15, 0.15), measured=15, seed=1) == 0  # off in CI
    assert extra_rounds(replace(cpu, worker_generations=3), slots(30, 0.15), measured=30, seed=1) == 0
