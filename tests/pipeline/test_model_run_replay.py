"""A model re-audit replays what the first run measured: the same suite-workload kernels and the
same artifact, no tuning, so its report is of the artifact a deployment is bound to."""

from __future__ import annotations

import pytest

import optimizer.model
import runners.evaluate
from optimizer.model import OptimizationArtifact
from pipeline import model_run, optimized
from runners import modelplan
from runners.inventory import take_inventory

SOURCE = "import torch\n\ndef kernel(*inputs):\n    return inputs[0]  # {key}\n"


@pytest.fixture(scope="module")
def llama_inventory(sample_models):
    return take_inventory(sample_models["llama"], batch=1, seq=8, device="cpu")


@pytest.fixture
def measured(monkeypatch):
    """What the audit stages were asked to measure (the audits themselves are tested elsewhere)."""
    seen: dict = {}

    def audit_specs(specs, sources, *, keys, **kwargs):
        seen["sources"] = dict(zip(keys, sources))
        return {"workloads": [], "protocol": {"seed": 7}}

    def end_to_end(model_dir, artifact, **kwargs):
        seen["artifact"] = artifact
        return {"skipped": "test"}

    monkeypatch.setattr(runners.evaluate, "audit_specs", audit_specs)
    monkeypatch.setattr(modelplan, "end_to_end_audit", end_to_end)
    return seen


def _artifact(audited: dict[str, str]) -> dict:
    return OptimizationArtifact(model={"architecture": "LlamaForCausalLM"}, device="cpu", hardware="cpu-test",
                                versions={}, workload={"batch": 1, "seq": 8}, strategy="eager", modules=[],
                                kernels={}, audited=audited).to_dict()


def test_a_first_run_records_the_kernels_it_audited_in_its_artifact(sample_models, llama_inventory, measured,
                                                                     monkeypatch, tmp_path):
    monkeypatch.setattr("runners.inventory.take_inventory", lambda *a, **k: llama_inventory)

    def tune_specs(specs, **kwargs):
        return {s.key: SOURCE.format(key=s.key) for s in specs}, []

    monkeypatch.setattr(optimized, "tune_specs", tune_specs)
    monkeypatch.setattr(optimizer.model, "optimize_model", lambda *a, **k: OptimizationArtifact.from_dict(_artifact({})))
    outcome = model_run.run_model_pipeline(sample_models["llama"], batch=1, seq=8, profile="cpu-ci", device="cpu",
                                           tuning_cache=tmp_path / "cache.jsonl", progress=lambda *a: None,
                                          workload_limit=2)
    assert len(outcome.artifact["audited"]) == 2
    assert outcome.artifact["audited"] == measured["sources"]
    assert outcome.result["optimization"]["replayed"] is False


def test_a_replay_tunes_nothing_and_measures_the_same_kernels_and_artifact(sample_models, llama_inventory, measured,
                                                                           monkeypatch, tmp_path):
    monkeypatch.setattr("runners.inventory.take_inventory", lambda *a, **k: llama_inventory)

    def refuse(*args, **kwargs):
        raise AssertionError("a re-audit must not tune or optimize again")

    monkeypatch.setattr(optimized, "tune_specs", refuse)
    monkeypatch.setattr(optimizer.model, "optimize_model", refuse)
    planned, _ = modelplan.plan_workloads(llama_inventory, profile="cpu-ci", limit=99)
    assert len(planned) >= 3
    # The first run audited two workloads, not the two heaviest: the replay follows the first run.
    chosen = {w.key: SOURCE.format(key=w.key) for w in planned[1:3]}
    replay = _artifact(chosen)
    outcome = model_run.run_model_pipeline(sample_models["llama"], batch=1, seq=8, profile="cpu-ci", device="cpu",
                                           tuning_cache=tmp_path / "cache.jsonl", progress=lambda *a: None,
                                          workload_limit=1, replay=replay)
    assert measured["sources"] == chosen
    assert measured["artifact"].to_dict() == replay
    assert outcome.artifact == replay  # same artifact, so the same artifact_sha256 once stored
    assert outcome.result["optimization"]["replayed"] is True
    left_out = {u["family"] for u in outcome.result["model"]["unsupported"]
                if u["reason"] == "not audited by the re-audited run"}
    assert planned[0].spec.name in left_out
