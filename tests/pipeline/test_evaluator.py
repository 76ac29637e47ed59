"""The optimizer's evaluator: quick sandboxed measurements with verification."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from optimizer.evaluation import Budget, Candidate, Evaluator, Measurement
from runners import suite
from pipeline.evaluator import SandboxEvaluator

HERE = Path(__file__).resolve().parents[1] / "runners"  # the candidates the harness tests share
SPEC = suite.find_spec("cpu-ci", "softmax")[0]


@pytest.fixture(scope="module")
def evaluator():
    with SandboxEvaluator(SPEC, device="cpu", seed=1) as grader:
        yield grader


def _candidate(source: str, name: str = "c") -> Candidate:
    return Candidate(workload="softmax", name=name, source=source)


def test_it_implements_the_optimizers_evaluator_protocol(evaluator):
    assert isinstance(evaluator, SandboxEvaluator)
    grader: Evaluator = evaluator  # structural: the optimizer only sees the protocol
    assert callable(grader.evaluate)


def test_it_measures_a_correct_candidate_against_the_baseline(evaluator):
    measurement = evaluator.evaluate(_candidate((HERE / "honest" / "softmax_alternative.py").read_text()), Budget(rounds=4))
    assert isinstance(measurement, Measurement)
    assert measurement.correct and measurement.reasons == ()
    assert measurement.median_s > 0 and measurement.baseline_median_s > 0 and measurement.spread >= 0
    assert 0.05 < measurement.speedup < 20


def test_it_reports_incorrect_and_crashing_candidates_with_reasons(evaluator):
    wrong = evaluator.evaluate(_candidate("import torch\ndef kernel(x):\n    return torch.softmax(x * 2, -1)\n"), Budget(rounds=2))
    assert not wrong.correct and wrong.median_s is None and "correctness.mismatch" in wrong.reasons
    cached = evaluator.evaluate(_candidate((HERE / "cheats" / "return_input.py").read_text()), Budget(rounds=2))
    assert not cached.correct and "integrity.output_aliases_input" in cached.reasons
    broken = evaluator.evaluate(_candidate("def kernel(x):\n    raise ValueError('nope')\n"), Budget(rounds=2))
    assert not broken.correct and broken.reasons == ("sandbox.candidate_exception",)


def test_it_grades_many_candidates_cheaply_with_one_sandbox(evaluator):
    source = suite.baseline_source(SPEC)
    evaluator.evaluate(_candidate(source), Budget(rounds=1))  # warm: sandbox and calibration exist
    started = time.monotonic()
    for index in range(3):
        assert evaluator.evaluate(_candidate(source, f"c{index}"), Budget(rounds=2)).correct
    assert (time.monotonic() - started) / 3 < 3.0  # a fresh Python + torch child alone costs ~2 s


def test_it_stops_measuring_when_the_budget_runs_out(evaluator):
    slow = "import time\nimport torch\ndef kernel(x):\n    time.sleep(0.002)\n    return torch.softmax(x, -1)\n"
    started = time.monotonic()
    measurement = evaluator.evaluate(_candidate(slow), Budget(rounds=500, max_seconds=2.0))
    assert measurement.correct and measurement.speedup < 1.0
    assert time.monotonic() - started < 30.0


def test_it_refuses_a_candidate_for_another_workload(evaluator):
    with pytest.raises(ValueError, match="softmax"):
        evaluator.evaluate(Candidate(workload="gemm", name="x", source=""), Budget())


def test_it_audits_a_models_own_shapes_under_a_profiles_protocol():
    from runners import result
    from runners.evaluate import audit_specs

    spec = suite.WorkloadSpec("rmsnorm", "normalization", {"R": 8, "H": 96}, "float32")
    document = audit_specs([spec], [suite.baseline_source(spec)], keys=["layer0.norm"], profile="cpu-ci", seed=2)
    result.validate_document(document)
    entry = document["workloads"][0]
    assert entry["key"] == "layer0.norm" and entry["shape"] == {"R": 8, "H": 96} and entry["verdict"] == "accepted"
    assert document["suite"]["manifest_sha256"] == suite.manifest_sha256("cpu-ci", specs=[spec])
    assert document["suite"]["manifest_sha256"] != suite.manifest_sha256("cpu-ci")
