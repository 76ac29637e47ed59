"""The whole-model audit on tiny real models: baseline vs optimized forward in sandboxed workers."""

from __future__ import annotations

import math

import pytest

from optimizer.model import Strategy, optimize_model
from runners import verify
from runners.modelaudit import FORWARD_TOLERANCE, audit_model_forward
from runners.samples import write_sample_model

BATCH, SEQ, ROUNDS = 2, 16, 4

# A wrong "optimized" model: the final norm's weight scaled by 1.5 scales every logit by 1.5.
SCALED_NORM = """
import torch

def transform(model):
    with torch.no_grad():
        model.model.norm.weight.mul_(1.5)
    return model
"""


def _audit(model_dir, artifact=None, **kwargs):
    options = dict(batch=BATCH, seq=SEQ, device="cpu", profile="cpu-ci", seed=7, rounds=ROUNDS)
    options.update(kwargs)
    return audit_model_forward(model_dir, artifact, **options)


def _phase(report: dict, name: str) -> dict:
    return next(p for p in report["phases"] if p["phase"] == name)


@pytest.fixture(scope="module")
def llama_artifact(sample_models):
    # The optimizer's real artifact, with the quick timer fixed so that no strategy beats the
    # unmodified model: `baseline`, applied through optimizer.model.apply without compiling.
    artifact = optimize_model(sample_models["llama"], batch=BATCH, seq=SEQ, device="cpu", try_compile=False,
                              timer=lambda fn: 1.0)
    assert artifact.strategy == Strategy.BASELINE
    return artifact


@pytest.fixture(scope="module")
def llama_report(sample_models, llama_artifact):
    progress: list[tuple[float, str]] = []
    report = _audit(sample_models["llama"], llama_artifact, progress=lambda f, m: progress.append((f, m)))
    report["_progress"] = progress
    return report


def test_it_audits_prefill_and_decode_of_a_llama_with_an_aa_control(llama_report):
    assert [p["phase"] for p in llama_report["phases"]] == ["prefill", "decode"]
    assert llama_report["artifact_strategy"] == "baseline" and llama_report["model_class"] == "LlamaForCausalLM"
    for phase in llama_report["phases"]:
        assert phase["verdict"] == "accepted", phase["reasons"]
        assert phase["rounds"] == ROUNDS and phase["calls_per_sample"] >= 1
        low, high = phase["ci95"]
        assert math.isfinite(low) and low <= phase["speedup"] <= high
        assert 0.3 < phase["speedup"] < 3.0  # the same model on both sides
        assert phase["baseline_median_s"] > 0 and phase["optimized_median_s"] > 0
        aa = phase["aa"]
        assert aa["ci95"][0] <= aa["speedup"] <= aa["ci95"][1] and isinstance(aa["stable"], bool)
        assert phase["billable"] == (aa["stable"] and low > 1.0)
        assert all(len(samples) == ROUNDS for samples in phase["samples_s"].values())
        # Identical models on identical tokens: the logits agree bit for bit.
        assert phase["correctness"]["passed"] and phase["correctness"]["max_abs_err"] == 0.0
        assert phase["correctness"]["checked_calls"] >= ROUNDS
        assert (phase["correctness"]["atol"], phase["correctness"]["rtol"]) == FORWARD_TOLERANCE["float32"]
    assert _phase(llama_report, "decode")["inputs"] == {"batch": BATCH, "cache_tokens": SEQ, "new_tokens": 1}
    assert llama_report["protocol"]["threads"] == 1 and llama_report["protocol"]["discount_preemption"]


def test_it_reports_progress_from_loading_to_the_verdicts(llama_report):
    fractions = [f for f, _ in llama_report["_progress"]]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    assert "prefill accepted" in llama_report["_progress"][-1][1]


def test_it_rejects_an_optimized_model_whose_logits_are_wrong(sample_models, llama_artifact):
    report = _audit(sample_models["llama"], llama_artifact, transform_source=SCALED_NORM)
    for phase in report["phases"]:
        assert phase["verdict"] == "rejected"
        codes = [r["code"] for r in phase["reasons"]]
        assert codes == ["correctness.mismatch"] and all(c in verify.REASON_CODES for c in codes)
        assert phase["speedup"] is None and phase["ci95"] is None and not phase["billable"]
        assert phase["rounds"] == 0  # caught in the warm-up round: a wrong model is not timed further
        assert phase["correctness"]["worst_ratio"] > 1.0


def test_it_rejects_an_optimized_side_that_works_between_its_windows(sample_models):
    # Right logits, but a thread that keeps computing while the worker should be idle (where
    # precomputed outputs or a stolen core would come from).
    busy = "import threading\n\ndef transform(model):\n" \
           "    threading.Thread(target=lambda: [sum(range(10_000)) for _ in iter(int, 1)], daemon=True).start()\n" \
           "    return model\n"
    report = _audit(sample_models["llama"], None, transform_source=busy, phases=("prefill",))
    prefill = _phase(report, "prefill")
    assert prefill["verdict"] == "rejected" and [r["code"] for r in prefill["reasons"]] == ["integrity.background_cpu"]
    assert prefill["correctness"]["passed"] and not prefill["billable"]


def test_it_reports_an_optimized_side_that_fails_to_load_as_an_error(sample_models):
    report = _audit(sample_models["llama"], None, transform_source="def transform(model):\n    raise RuntimeError('boom')\n",
                    phases=("prefill",))
    prefill = _phase(report, "prefill")
    assert prefill["verdict"] == "error" and prefill["reasons"][0]["code"] == "sandbox.import_error"
    assert "boom" in prefill["reasons"][0]["message"] and not prefill["billable"]
    assert _phase(report, "decode")["verdict"] == "skipped"


@pytest.mark.parametrize("family, decode", [("gpt2", True), ("bert", False)])
def test_it_audits_other_architectures_and_skips_decode_without_a_next_token_step(tmp_path, family, decode):
    folder = write_sample_model(tmp_path / family, family)
    report = _audit(folder, None, rounds=2)
    assert _phase(report, "prefill")["verdict"] == "accepted", _phase(report, "prefill")["reasons"]
    assert _phase(report, "decode")["verdict"] == ("accepted" if decode else "skipped")
    if not decode:
        assert "does not generate" in _phase(report, "decode")["note"] and report["notes"]


def test_it_refuses_what_cannot_be_audited_before_starting_workers(sample_models, tmp_path):
    with pytest.raises(ValueError, match="positions"):
        _audit(sample_models["llama"], seq=10_000)
    with pytest.raises(ValueError, match="unknown phase"):
        _audit(sample_models["llama"], phases=("generate",))
    with pytest.raises(ValueError, match="schema"):
        _audit(sample_models["llama"], {"schema": "something/else"})
    with pytest.raises(ValueError):
        _audit(tmp_path / "missing")


@pytest.mark.slow  # the optimized worker compiles the whole model with Inductor: ~45 s on two cores
def test_it_measures_a_compiled_artifact_without_mistaking_its_compiler_for_hidden_work(llama_artifact, sample_models):
    # What optimize_model emits when whole-model torch.compile wins its quick estimate.
    compiled = {**llama_artifact.to_dict(), "strategy": Strategy.COMPILE, "compile": {"dynamic": False}}
    report = _audit(sample_models["llama"], compiled, rounds=6, phases=("prefill",))
    prefill = _phase(report, "prefill")
    assert report["artifact_strategy"] == "whole-model-compile"
    # Dynamo's objects from the first call must not make preparing look like hidden work.
    assert prefill["verdict"] == "accepted", prefill["reasons"]
    assert prefill["speedup"] > 0 and 0 < prefill["correctness"]["worst_ratio"] <= 1.0


def test_an_artifact_is_applied_in_the_sandbox_by_its_own_applier_and_its_failure_is_its_own(sample_models,
                                                                                            llama_artifact):
    """The judge imports no optimizer code: the artifact's applier runs in the optimized worker, so an
    artifact made for another config fails there, as the artifact's error, not the harness's."""
    altered = llama_artifact.to_dict()
    altered["model"] = {**altered["model"], "config_sha256": "0" * 64}
    report = _audit(sample_models["llama"], altered, phases=("prefill",))
    prefill = _phase(report, "prefill")
    assert prefill["verdict"] == "error" and prefill["reasons"][0]["code"] == "sandbox.import_error"
    assert "applying the optimization artifact" in prefill["reasons"][0]["message"]
    assert "config differs" in prefill["reasons"][0]["message"]


def test_an_artifact_document_is_checked_before_any_worker_starts():
    from runners.artifact import applier_source, artifact_document

    with pytest.raises(ValueError, match="is not 'dyno.optimization-artifact/1'"):
        artifact_document({"schema": "dyno.optimization-artifact/0"})
    with pytest.raises(ValueError, match="lacks model, device"):
        artifact_document({"schema": "dyno.optimization-artifact/1"})
    full = {"schema": "dyno.optimization-artifact/1", "model": {}, "device": "cpu", "hardware": "h", "versions": {},
            "workload": {}, "strategy": "baseline", "modules": [], "kernels": {}}
    with pytest.raises(ValueError, match="applier"):
        artifact_document({**full, "applier": "os:system; rm -rf"})
    source = applier_source(artifact_document(full))
    assert "from optimizer.model import apply as _apply" in source
    namespace: dict = {}
    exec(compile(source.replace("from optimizer.model import apply as _apply",
                                "_apply = lambda model, artifact: ('applied', artifact['strategy'])"), "t", "exec"), namespace)
    assert namespace["transform"]("m") == ("applied", "baseline")
