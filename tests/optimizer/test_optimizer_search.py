"""The tuning search: exhaustive and successive-halving picks, the baseline's guarantee, dropped and
skipped candidates, and tune_workload's use of the cache."""

from __future__ import annotations

import json

import pytest

from optimizer.cache import MemoryTuningCache, make_key
from optimizer.evaluation import Candidate
from optimizer.search import SearchNote, Verdict, search, tune_workload
from tests.optimizer.fake_evaluator import FakeEvaluator

SHAPE = {"R": 500, "H": 256}


def candidates(n: int) -> list[Candidate]:
    out = [Candidate("w", "baseline", "def kernel(x):\n    return x\n", {"variant": "baseline"})]
    out += [Candidate("w", f"c{i}", f"def kernel(x):\n    return x  # {i}\n", {"variant": f"c{i}"}) for i in range(n)]
    return out


def test_it_picks_the_fastest_candidate_exhaustively_in_a_small_space():
    ev = FakeEvaluator({"baseline": 1.0, "c0": 0.8, "c1": 0.5, "c2": 0.9})
    out = search(candidates(3), ev, time_budget_s=100)
    assert out.strategy == "exhaustive"
    assert out.chosen.name == "c1"
    assert out.speedup_estimate == pytest.approx(2.0)
    assert sorted(name for name, _ in ev.calls) == ["baseline", "c0", "c1", "c2"]


def test_it_halves_a_large_space_and_still_finds_the_fastest():
    times = {"baseline": 1.0, **{f"c{i}": 0.95 - 0.01 * i for i in range(12)}, "c7": 0.3}
    ev = FakeEvaluator(times, noise=0.05, seed=3)
    out = search(candidates(12), ev, time_budget_s=100)
    assert out.strategy == "successive-halving"
    assert out.chosen.name == "c7"
    rounds_spent = sum(r for _, r in ev.calls)
    assert rounds_spent < 13 * 10, "halving must spend fewer rounds than measuring everyone fully"
    full = [name for name, r in ev.calls if r == 10]
    assert "c7" in full and "baseline" in full
    eliminated = [t for t in out.trials if SearchNote.ELIMINATED in t.reasons]
    assert eliminated, "the slow half must be recorded as eliminated"


def test_it_keeps_the_baseline_when_nothing_is_meaningfully_faster():
    ev = FakeEvaluator({"baseline": 1.0, "c0": 0.99, "c1": 1.5})
    out = search(candidates(2), ev, time_budget_s=100)
    assert out.chosen.name == "baseline"
    assert any(n.startswith(SearchNote.NOT_FASTER) for n in out.notes)


def test_it_never_chooses_a_candidate_slower_than_the_baseline():
    ev = FakeEvaluator({"baseline": 1.0}, default_s=2.0)
    out = search(candidates(8), ev, time_budget_s=100)
    assert out.chosen.name == "baseline"


def test_it_drops_incorrect_and_raising_candidates_at_once_with_their_reasons():
    ev = FakeEvaluator({"baseline": 1.0, "c0": 0.1, "c1": 0.05, "c2": 0.7}, incorrect={"c0"}, raises={"c1"})
    out = search(candidates(3), ev, time_budget_s=100)
    assert out.chosen.name == "c2"
    by_name = {t.candidate: t for t in out.trials}
    assert by_name["c0"].verdict == Verdict.INCORRECT and "correctness.mismatch" in by_name["c0"].reasons
    assert by_name["c1"].verdict == Verdict.ERROR and by_name["c1"].reasons[0] == SearchNote.EVALUATOR_RAISED
    assert "worker for c1 died" in by_name["c1"].reasons[1]
    assert [name for name, _ in ev.calls].count("c0") == 1, "an incorrect candidate is never measured again"


def test_it_drops_incorrect_candidates_in_halving_too():
    times = {"baseline": 1.0, **{f"c{i}": 0.9 for i in range(9)}, "c4": 0.2}
    ev = FakeEvaluator(times, incorrect={"c4"})
    out = search(candidates(9), ev, time_budget_s=100)
    assert out.chosen.name != "c4"
    assert [name for name, _ in ev.calls].count("c4") == 1


def test_it_records_skipped_candidates_when_the_budget_runs_out():
    clock = [0.0]
    ev = FakeEvaluator({"baseline": 1.0, "c0": 0.5}, default_s=0.1, seconds_per_round=1.0, clock=clock)
    out = search(candidates(4), ev, time_budget_s=15, now=lambda: clock[0])
    skipped = [t for t in out.trials if t.verdict == Verdict.SKIPPED]
    assert skipped and all(SearchNote.BUDGET_EXHAUSTED in t.reasons for t in skipped)
    assert out.chosen.name == "c0", "the best of what was measured before the budget ran out"
    assert all(t.candidate != "baseline" for t in skipped), "the baseline is always measured"


def test_it_measures_the_baseline_even_with_no_budget_left():
    clock = [0.0]
    ev = FakeEvaluator({"baseline": 1.0}, seconds_per_round=1.0, clock=clock)
    out = search(candidates(3), ev, time_budget_s=0, now=lambda: clock[0])
    assert out.chosen.name == "baseline"
    assert ev.calls[0][0] == "baseline"


def test_it_tunes_a_workload_and_serializes_every_trial():
    ev = FakeEvaluator({"baseline": 1.0, "compile-fused": 0.5})
    result = tune_workload("rmsnorm", "rmsnorm", SHAPE, "float32", ev, device="cpu", hardware="test-hw")
    assert result.chosen.name.startswith("compile-fused")
    assert result.chosen.params["variant"] == "compile-fused"
    assert not result.cache_hit and result.trials
    data = json.loads(json.dumps(result.to_dict()))
    assert data["chosen"]["source_sha256"] == result.chosen.source_sha256
    assert {t["verdict"] for t in data["trials"]} <= {"correct", "incorrect", "error", "skipped"}


def test_it_resolves_the_suites_family_categories_through_the_workload_name():
    ev = FakeEvaluator({"baseline": 1.0})
    result = tune_workload("rmsnorm", "normalization", SHAPE, "float32", ev, device="cpu", hardware="test-hw")
    assert result.family == "rmsnorm"
    with pytest.raises(ValueError, match="no kernel family"):
        tune_workload("conv2d", "vision", SHAPE, "float32", ev, device="cpu", hardware="test-hw")
    with pytest.raises(ValueError, match=r"lacks \['H'\]"):
        tune_workload("rmsnorm", "normalization", {"R": 8}, "float32", ev, device="cpu", hardware="test-hw")


def test_it_skips_the_search_on_a_warm_cache_and_reuses_a_bucket():
    cache = MemoryTuningCache()
    ev = FakeEvaluator({"baseline": 1.0, "compile-fused": 0.5})
    first = tune_workload("rmsnorm", "rmsnorm", SHAPE, "float32", ev, device="cpu", cache=cache, hardware="hw")
    calls = len(ev.calls)
    again = tune_workload("rmsnorm", "rmsnorm", SHAPE, "float32", ev, device="cpu", cache=cache, hardware="hw")
    assert again.cache_hit and again.trials == [] and len(ev.calls) == calls
    assert again.chosen.source == first.chosen.source
    # R=300 shares R=500's bucket (512): reused without a search. H is exact: H=128 searches.
    other_batch = tune_workload("rmsnorm", "rmsnorm", {"R": 300, "H": 256}, "float32", ev, device="cpu",
                                cache=cache, hardware="hw")
    assert other_batch.cache_hit and len(ev.calls) == calls
    other_width = tune_workload("rmsnorm", "rmsnorm", {"R": 500, "H": 128}, "float32", ev, device="cpu",
                                cache=cache, hardware="hw")
    assert not other_width.cache_hit and len(ev.calls) > calls


def test_it_searches_again_for_other_hardware_or_dtype():
    cache = MemoryTuningCache()
    ev = FakeEvaluator({"baseline": 1.0})
    tune_workload("rmsnorm", "rmsnorm", SHAPE, "float32", ev, device="cpu", cache=cache, hardware="hw-a")
    assert not tune_workload("rmsnorm", "rmsnorm", SHAPE, "float32", ev, device="cpu", cache=cache,
                             hardware="hw-b").cache_hit
    assert not tune_workload("rmsnorm", "rmsnorm", SHAPE, "bfloat16", ev, device="cpu", cache=cache,
                             hardware="hw-a").cache_hit
    assert make_key("rmsnorm", SHAPE, "float32", hardware="hw-a", device="cpu").digest() != make_key(
        "rmsnorm", SHAPE, "float32", hardware="hw-a", device="cuda").digest()
