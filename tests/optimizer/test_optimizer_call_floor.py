"""The search skips a candidate that cannot beat the baseline whatever it computes: a compiled CPU
call has a fixed cost, and a baseline already below it leaves nothing to win (nor to build for)."""

from __future__ import annotations

from optimizer.candidates import CPU_COMPILED_CALL_FLOOR_S, call_floor_s, candidate_space
from optimizer.evaluation import Candidate
from optimizer.search import SearchNote, Verdict, search, tune_workload
from tests.optimizer.fake_evaluator import FakeEvaluator

SHAPE = {"R": 32, "H": 256}


def _names(calls: list[tuple[str, int]]) -> list[str]:
    return [name for name, _ in calls]


def test_it_skips_compiled_candidates_when_the_baseline_is_faster_than_a_compiled_call():
    ev = FakeEvaluator({"baseline": CPU_COMPILED_CALL_FLOOR_S / 2})
    out = tune_workload("rmsnorm", "rmsnorm", SHAPE, "float32", ev, device="cpu", time_budget_s=100)
    assert not any(name.startswith("compile-") for name in _names(ev.calls))
    skipped = [t for t in out.trials if SearchNote.FLOOR_ABOVE_BASELINE in t.reasons]
    assert skipped and all(t.verdict == Verdict.SKIPPED and t.candidate.startswith("compile-") for t in skipped)
    # what is not compiled is still measured
    assert "baseline[threads=1]" in _names(ev.calls) and out.chosen.name == "baseline"


def test_it_still_measures_compiled_candidates_above_the_floor():
    ev = FakeEvaluator({"baseline": 1e-3, "compile-fused": 4e-4})
    out = tune_workload("rmsnorm", "rmsnorm", SHAPE, "float32", ev, device="cpu", time_budget_s=100)
    assert out.chosen.name.startswith("compile-fused")
    assert not any(SearchNote.FLOOR_ABOVE_BASELINE in t.reasons for t in out.trials)


def test_it_knows_no_floor_on_gpu_nor_for_eager_candidates():
    cpu = candidate_space("rmsnorm", "rmsnorm", SHAPE, "float32", "cpu")
    assert {call_floor_s(c, "cpu") > 0 for c in cpu} == {True, False}
    assert all(call_floor_s(c, "cpu") == 0 for c in cpu if not c.name.startswith("compile-"))
    gpu = candidate_space("rmsnorm", "rmsnorm", SHAPE, "float32", "cuda")
    assert all(call_floor_s(c, "cuda") == 0 for c in gpu)


def test_it_does_not_skip_on_a_floor_when_the_baseline_was_not_measured():
    cands = [Candidate("w", "baseline", "a", {"variant": "baseline"}), Candidate("w", "c0", "b", {"variant": "compile-x"})]
    ev = FakeEvaluator({"baseline": 1e-6, "c0": 5e-7}, incorrect={"baseline"})
    out = search(cands, ev, time_budget_s=100, floor_s=lambda c: 1.0)
    assert _names(ev.calls) == ["baseline", "c0"]
    assert not any(SearchNote.FLOOR_ABOVE_BASELINE in t.reasons for t in out.trials)
