"""The run state machine: conditional transitions, cancellation, the reaper, worker restarts."""

from datetime import timedelta

import pytest
from django.utils import timezone

from accounts.selectors import Actor
from runs.models import Run
from runs.services import (
    RunCancelled, RunRejected, run_cancel, run_claim, run_fail, run_progress, run_start, run_succeed,
    runs_fail_held_by, runs_reap_stale,
)
from runs.status import TRANSITIONS, Status, sources_of

from .helpers import upload_version

pytestmark = pytest.mark.django_db


@pytest.fixture
def queued(make_org, sample_models, media_root, django_capture_on_commit_callbacks):
    org = make_org()
    actor = Actor(roles={org.pk: "owner"})
    version = upload_version(org=org, folder=sample_models["llama"])
    with django_capture_on_commit_callbacks(execute=False):
        run = run_start(actor=actor, version=version, hardware="cpu")
    return run, actor


def test_it_allows_only_forward_transitions():
    assert sources_of(Status.RUNNING) == [Status.QUEUED]
    for final in (Status.SUCCEEDED, Status.FAILED, Status.CANCELLED):
        assert TRANSITIONS[final] == frozenset()
        assert final not in sources_of(Status.QUEUED)


def test_it_claims_a_run_once(queued):
    run, _ = queued
    assert run_claim(run_id=run.pk, worker="w1@host") is True
    assert run_claim(run_id=run.pk, worker="w2@host") is False  # a duplicate delivery
    run.refresh_from_db()
    assert (run.status, run.worker, run.attempts) == ("running", "w1@host", 1)


def test_it_stops_a_worker_whose_run_was_cancelled(queued):
    run, actor = queued
    run_claim(run_id=run.pk, worker="w1@host")
    run_progress(run_id=run.pk, worker="w1@host", fraction=0.3, message="working")
    assert run_cancel(actor=actor, run=run) is True
    with pytest.raises(RunCancelled):
        run_progress(run_id=run.pk, worker="w1@host", fraction=0.6)
    assert run_succeed(run_id=run.pk, worker="w1@host", inventory={"x": 1}) is False
    run.refresh_from_db()
    assert run.status == "cancelled" and run.inventory is None


def test_it_cancels_a_queued_run_before_any_worker_sees_it(queued):
    run, actor = queued
    run_cancel(actor=actor, run=run)
    assert run_claim(run_id=run.pk, worker="w1@host") is False
    with pytest.raises(RunRejected, match="nothing to cancel"):
        run_cancel(actor=actor, run=Run.objects.get(pk=run.pk))


def test_it_ignores_a_result_from_a_worker_that_lost_the_run(queued):
    run, _ = queued
    run_claim(run_id=run.pk, worker="w1@host")
    assert run_fail(run_id=run.pk, worker="w2@host", error="not mine") is False
    assert run_succeed(run_id=run.pk, worker="w2@host", inventory={}) is False
    assert run_succeed(run_id=run.pk, worker="w1@host", inventory={"ok": True}) is True
    run.refresh_from_db()
    assert (run.status, run.progress, run.inventory) == ("succeeded", 1.0, {"ok": True})


def test_it_reaps_runs_whose_worker_went_silent(queued):
    run, _ = queued
    run_claim(run_id=run.pk, worker="w1@host")
    assert runs_reap_stale(stale_seconds=60) == []
    Run.objects.filter(pk=run.pk).update(heartbeat_at=timezone.now() - timedelta(seconds=120))
    assert runs_reap_stale(stale_seconds=60) == [str(run.pk)]
    run.refresh_from_db()
    assert run.status == "failed" and "stopped sending heartbeats" in run.error


def test_it_fails_what_a_restarted_worker_held(queued):
    run, _ = queued
    run_claim(run_id=run.pk, worker="w1@host")
    assert runs_fail_held_by(worker="w2@host") == []
    assert runs_fail_held_by(worker="w1@host") == [str(run.pk)]
    assert Run.objects.get(pk=run.pk).status == "failed"


def test_it_refuses_runs_from_readers(make_org, sample_models, media_root):
    org = make_org()
    version = upload_version(org=org, folder=sample_models["llama"])
    with pytest.raises(RunRejected, match="not start runs"):
        run_start(actor=Actor(roles={org.pk: "auditor"}), version=version, hardware="cpu")


@pytest.mark.parametrize("kwargs, message", [
    ({"hardware": "quantum"}, "unknown"), ({"hardware": "cpu", "profile": "huge"}, "profile"),
    ({"hardware": "cpu", "batch": 0}, "batch"), ({"hardware": "cpu", "seq": 10**6}, "seq"),
])
def test_it_explains_a_bad_run_request(make_org, sample_models, media_root, kwargs, message):
    org = make_org()
    version = upload_version(org=org, folder=sample_models["llama"])
    with pytest.raises(RunRejected, match=message):
        run_start(actor=Actor(roles={org.pk: "owner"}), version=version, **kwargs)
    assert Run.objects.count() == 0


def test_the_run_page_says_what_the_optimizer_rewrote_kept_and_why(client, make_org, make_member):
    from catalog.models import Model, ModelVersion
    from django.contrib.auth import get_user_model

    from runs.models import Run

    org = make_org("acme", owner="owner@acme.test")
    model = Model.objects.create(organization=org, name="tiny")
    version = ModelVersion.objects.create(model=model, number=1, kind="weights", family="llama",
                                          architecture="LlamaForCausalLM", parameter_count=1000, dtype="float32",
                                          config={}, storage_dir="models/x", total_bytes=1)
    artifact = {"schema": "dyno.optimization-artifact/1", "strategy": "patched-modules", "modules": [
        {"module": f"model.layers.{i}.input_layernorm", "module_class": "LlamaRMSNorm", "family": "normalization",
         "status": "optimized", "kernel": "rmsnorm_triton"} for i in range(2)] + [
        {"module": "model.layers.0.self_attn", "module_class": "LlamaAttention", "family": "attention",
         "status": "fallback", "reason": "model-level attention patching is not implemented"}],
        "verification": {}, "notes": ["2 of 3 modules rewritten"]}
    run = Run.objects.create(organization=org, model_version=version, hardware="cpu", profile="cpu-ci",
                             artifact=artifact)
    client.force_login(get_user_model().objects.get(email="owner@acme.test"))
    page = client.get(f"/runs/{run.pk}").content.decode()
    assert "What the optimizer did" in page and "patched into the modules" in page
    assert "LlamaRMSNorm" in page and "rewritten" in page and "rmsnorm_triton" in page
    assert "model-level attention patching is not implemented" in page and "kept (not supported)" in page


def test_the_run_page_says_whether_the_model_figure_bills_and_which_check_stops_it(client, make_org):
    from catalog.models import Model, ModelVersion
    from django.contrib.auth import get_user_model

    from runners.modelplan import billed_model_block
    from runs.models import Run

    org = make_org("acme", owner="owner@acme.test")
    model = Model.objects.create(organization=org, name="tiny")
    version = ModelVersion.objects.create(model=model, number=1, kind="weights", family="llama",
                                          architecture="LlamaForCausalLM", parameter_count=1000, dtype="float32",
                                          config={}, storage_dir="models/x", total_bytes=1)
    amdahl = {"speedup": 1.1, "ci95": [1.0, 1.2], "method": "weighted"}

    def phase(name, ci, aa):
        return {"phase": name, "verdict": "accepted", "speedup": sum(ci) / 2, "ci95": ci, "reasons": [],
                "aa": {"speedup": sum(aa) / 2, "ci95": aa, "stable": 0.95 <= aa[0] and aa[1] <= 1.05},
                "reference_points": {"torch-compile": {"speedup_over_eager": 1.41, "ci95": [1.3, 1.5],
                                                       "artifact_over_reference": 0.93, "artifact_over_reference_ci95": [0.9, 0.97]}}}

    client.force_login(get_user_model().objects.get(email="owner@acme.test"))
    pages = {}
    for label, decode_aa in (("bills", [0.98, 1.03]), ("unstable", [0.99, 1.08])):
        block = billed_model_block(amdahl, {"protocol": {"aa_tolerance": 0.05},
                                            "phases": [phase("prefill", [1.2, 1.4], [0.98, 1.02]), phase("decode", [1.3, 1.6], decode_aa)]})
        run = Run.objects.create(organization=org, model_version=version, hardware="cpu", profile="cpu-ci", status="succeeded",
                                 result={"model": block}, model_speedup=block["speedup"], model_ci_low=block["ci95"][0],
                                 model_ci_high=block["ci95"][1], stable=block["stable"])
        pages[label] = client.get(f"/runs/{run.pk}").content.decode()
    assert "it bills on its CI lower bound" in pages["bills"] and "does not bill" not in pages["bills"]
    assert "it does not bill" in pages["unstable"] and "model.aa_unstable" in pages["unstable"]
    assert "decode: two identical baseline workers differ" in pages["unstable"]
    # What the free compiler gets on the same rounds, beside the artifact.
    assert 'id="reference-prefill-torch-compile"' in pages["bills"] and "1.410x over eager" in pages["bills"]
    assert "the artifact 0.930x over it (0.900–0.970)" in pages["bills"]
