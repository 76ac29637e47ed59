"""The model run's pure parts: which inventory entries the suite audits, and the model-level figure."""

import pytest

from runners.modelplan import PlannedWorkload, model_figure, plan_workloads
from runners.suite import find_spec


def _inventory(*entries):
    return {"workloads": list(entries)}


def test_it_maps_inventory_entries_to_suite_specs_and_merges_duplicates():
    inventory = _inventory(
        {"family": "gemm", "shape": {"M": 32, "K": 64, "N": 64}, "dtype": "float32", "count": 4, "eager_time_s": 0.004},
        {"family": "gemm", "shape": {"M": 32, "K": 64, "N": 64}, "dtype": "float32", "count": 2, "eager_time_s": 0.002},
        {"family": "rmsnorm", "shape": {"R": 32, "H": 64}, "dtype": "float32", "count": 5, "eager_time_s": 0.001},
    )
    planned, unsupported = plan_workloads(inventory, profile="cpu-ci", limit=10)
    assert unsupported == []
    assert [(w.spec.name, w.count) for w in planned] == [("gemm", 6), ("rmsnorm", 5)]
    assert planned[0].spec.shape == {"M": 32, "K": 64, "N": 64}
    assert planned[0].eager_time_s == pytest.approx(0.006)
    assert planned[0].key == "gemm[M=32,K=64,N=64]float32"


@pytest.mark.parametrize("entry, reason", [
    ({"family": "conv2d", "shape": {"N": 1}}, "not a suite workload"),
    ({"family": "attention_prefill", "shape": {"B": 1, "Hq": 2, "Hkv": 2, "S": 8, "D": 16},
      "attrs": {"causal": False}}, "non-causal"),
    ({"family": "moe", "shape": {"T": 8, "H": 16, "F": 32, "E": 4, "topk": 1}}, "top-2"),
    ({"family": "gemm", "shape": {"M": 8, "K": 8, "N": 8}, "attrs": {"bias": True}}, "biased"),
])
def test_it_reports_what_the_suite_cannot_audit(entry, reason):
    entry = {"dtype": "float32", "count": 1, "eager_time_s": 0.001, **entry}
    planned, unsupported = plan_workloads(_inventory(entry), profile="cpu-ci", limit=10)
    assert planned == [] and reason in unsupported[0].reason


def test_it_audits_only_the_heaviest_workloads():
    entries = [{"family": "rmsnorm", "shape": {"R": r, "H": 64}, "dtype": "float32", "count": 1,
                "eager_time_s": r / 1000} for r in (1, 2, 3)]
    planned, unsupported = plan_workloads(_inventory(*entries), profile="cpu-ci", limit=2)
    assert [w.spec.shape["R"] for w in planned] == [3, 2]
    assert "heaviest" in unsupported[0].reason


def _planned(name: str, seconds: float) -> PlannedWorkload:
    spec = find_spec("cpu-ci", name)[0]
    return PlannedWorkload(spec.key, spec, 1, seconds)


def test_it_weights_the_model_figure_by_eager_time():
    gemm, norm = _planned("gemm", 0.6), _planned("rmsnorm", 0.2)
    entries = [
        {"key": gemm.key, "verdict": "accepted", "speedup": 2.0, "ci95": [1.5, 2.5]},
        {"key": norm.key, "verdict": "rejected", "speedup": None, "ci95": None},
    ]
    figure = model_figure(entries, [gemm, norm], total_time_s=1.0, unsupported=[])
    # 60% of the time at 2x, the rejected 20% and the other 20% at 1x: 1 / (0.3 + 0.4) = 1.4286
    assert figure["speedup"] == pytest.approx(1 / 0.7)
    assert figure["ci95"][0] == pytest.approx(1 / (0.6 / 1.5 + 0.4))
    assert figure["ci95"][1] == pytest.approx(1 / (0.6 / 2.5 + 0.4))
    assert figure["audited_share"] == pytest.approx(0.8)
    assert [w["verdict"] for w in figure["weighting"]] == ["accepted", "rejected"]


def test_it_never_lets_a_slower_workload_raise_the_figure():
    gemm = _planned("gemm", 0.5)
    entries = [{"key": gemm.key, "verdict": "accepted", "speedup": 0.8, "ci95": [0.7, 0.9]}]
    figure = model_figure(entries, [gemm], total_time_s=1.0, unsupported=[])
    assert figure["speedup"] < 1 and figure["ci95"][0] < figure["speedup"] < figure["ci95"][1]


def test_it_records_an_end_to_end_audit_that_cannot_run_instead_of_failing_the_run(tmp_path, caplog):
    from runners.modelplan import end_to_end_audit

    outcome = end_to_end_audit(tmp_path / "no-such-model", None, batch=2, seq=16, device="cpu", profile="cpu-ci",
                               seed=1, progress=lambda f, m: None)
    assert set(outcome) == {"error"} and "config.json" in outcome["error"]
    assert "end-to-end audit" in caplog.text  # logged with its traceback, not swallowed


def test_it_lets_a_task_time_limit_through_the_end_to_end_audit(monkeypatch, tmp_path):
    import runners.modelaudit
    from runners.modelplan import end_to_end_audit

    class SoftTimeLimitExceeded(Exception):  # Celery's, by name: the pipeline imports no Celery
        pass

    def out_of_time(*args, **kwargs):
        raise SoftTimeLimitExceeded()

    monkeypatch.setattr(runners.modelaudit, "audit_model_forward", out_of_time)
    with pytest.raises(SoftTimeLimitExceeded):
        end_to_end_audit(tmp_path, None, batch=2, seq=16, device="cpu", profile="cpu-ci", seed=1,
                         progress=lambda f, m: None)


def test_it_lets_the_callers_own_stop_through_the_end_to_end_audit(monkeypatch, tmp_path):
    """A cancelled run stops inside the end-to-end audit; the fail-soft net must not catch it."""
    import runners.modelaudit
    from runners.modelplan import end_to_end_audit

    class RunCancelled(Exception):
        pass

    def reports_progress(*args, progress, **kwargs):
        progress(0.5, "measuring")
        return {"phases": []}

    def cancelled(fraction, message):
        raise RunCancelled()

    monkeypatch.setattr(runners.modelaudit, "audit_model_forward", reports_progress)
    with pytest.raises(RunCancelled):
        end_to_end_audit(tmp_path, None, batch=2, seq=16, device="cpu", profile="cpu-ci", seed=1, progress=cancelled)


def _phase(name, speedup, ci, *, verdict="accepted", stable=True, reasons=()):
    return {"phase": name, "verdict": verdict, "speedup": speedup, "ci95": ci, "aa": {"stable": stable},
            "reasons": list(reasons)}


def _amdahl():
    gemm = _planned("gemm", 0.6)
    entries = [{"key": gemm.key, "verdict": "accepted", "speedup": 2.0, "ci95": [1.5, 2.5]}]
    return model_figure(entries, [gemm], total_time_s=1.0, unsupported=[])


def test_the_end_to_end_phase_with_the_lowest_bound_bills_and_the_amdahl_figure_stays_beside_it():
    from runners.modelplan import billed_model_block

    amdahl = _amdahl()
    block = billed_model_block(amdahl, {"phases": [_phase("prefill", 1.3, [1.2, 1.4]), _phase("decode", 1.5, [1.1, 1.9])]})
    assert (block["basis"], block["billed_phase"], block["speedup"], block["ci95"]) == ("end_to_end", "decode", 1.5, [1.1, 1.9])
    assert block["stable"] is True and block["verdict"] == "accepted"
    assert block["amdahl"]["speedup"] == amdahl["speedup"] and block["weighting"] == amdahl["weighting"]
    # A skipped phase (an encoder has no decode step) is not audited, so it cannot block the figure.
    encoder = billed_model_block(amdahl, {"phases": [_phase("prefill", 1.1, [1.05, 1.2]),
                                                     _phase("decode", None, None, verdict="skipped", stable=None)]})
    assert encoder["billed_phase"] == "prefill" and encoder["stable"] is True


def test_an_unstable_end_to_end_control_makes_the_billed_figure_unstable():
    from runners.modelplan import billed_model_block

    block = billed_model_block(_amdahl(), {"phases": [_phase("prefill", 1.3, [1.2, 1.4]),
                                                      _phase("decode", 1.5, [1.3, 1.7], stable=False)]})
    assert block["billed_phase"] == "prefill" and block["stable"] is False


def test_an_accepted_figure_that_does_not_bill_says_which_check_stops_it():
    from runners.modelplan import billed_model_block

    bills = billed_model_block(_amdahl(), {"phases": [_phase("prefill", 1.3, [1.2, 1.4])]})
    assert bills["not_billable"] == []
    decode = {**_phase("decode", 1.02, [0.97, 1.08], stable=False), "aa": {"stable": False, "ci95": [0.99, 1.081]}}
    block = billed_model_block(_amdahl(), {"protocol": {"aa_tolerance": 0.05},
                                           "phases": [_phase("prefill", 1.3, [1.2, 1.4]), decode]})
    assert [n["code"] for n in block["not_billable"]] == ["model.aa_unstable", "model.no_proven_speedup"]
    assert "decode" in block["not_billable"][0]["message"] and "0.990-1.081 outside 1 +- 0.05" in block["not_billable"][0]["message"]
    assert "lower bound 0.970 is not above 1" in block["not_billable"][1]["message"]


def test_an_artifact_proven_slower_says_so_and_that_it_should_not_be_deployed():
    from runners.modelplan import billed_model_block

    block = billed_model_block(_amdahl(), {"phases": [_phase("prefill", 0.898, [0.858, 0.953]),
                                                      _phase("decode", 1.02, [0.97, 1.08])]})
    codes = [n["code"] for n in block["not_billable"]]
    assert codes == ["model.no_proven_speedup", "model.slower"]
    assert "prefill" in block["not_billable"][1]["message"] and "0.858-0.953" in block["not_billable"][1]["message"]
    assert "do not deploy" in block["not_billable"][1]["message"]
    # Inside noise of 1 is not "slower": only an interval wholly below 1 is.
    level = billed_model_block(_amdahl(), {"phases": [_phase("prefill", 0.998, [0.958, 1.035])]})
    assert [n["code"] for n in level["not_billable"]] == ["model.no_proven_speedup"]


def test_no_model_figure_bills_when_the_end_to_end_audit_did_not_run_or_refused_the_artifact():
    from runners.modelplan import billed_model_block

    amdahl = _amdahl()
    missing = billed_model_block(amdahl, {"error": "RuntimeError: no"})
    assert missing["speedup"] is None and missing["ci95"] is None and missing["stable"] is False
    assert [r["code"] for r in missing["reasons"]] == ["model.no_end_to_end"]
    assert missing["amdahl"]["speedup"] == pytest.approx(amdahl["speedup"])  # never standing in for it
    refused = billed_model_block(amdahl, {"phases": [
        _phase("prefill", 1.3, [1.2, 1.4]),
        _phase("decode", None, None, verdict="rejected", reasons=[{"code": "correctness.mismatch", "message": "logits differ"}])]})
    assert refused["speedup"] is None and refused["verdict"] == "rejected"
    assert refused["reasons"] == [{"code": "correctness.mismatch", "message": "decode: logits differ"}]
