"""Re-audits executed: a request (an auditor's or a dispute's) starts exactly one run that repeats
the report's measurement, whose report supersedes the original and shows beside it, figure by figure."""

from __future__ import annotations

import hashlib
import json
import threading

import pytest
from django.db import connection

from accounts.selectors import Actor
from reports.compare import compare_bodies, reaudit_dict
from reports.models import ReauditRequest, Report
from reports.selectors import runs_missing_report
from reports.services import reaudit_dispatch, reaudit_request, report_create_for_run, report_dispute, reports_sweep
from reports.tasks import report_create
from runs.models import Run, RunKind
from runs.services import RunRejected, run_cancel, run_claim, run_fail, run_succeed
from runs.status import Stage, Status
from tests.reports.builders import FINISHED_AT, synthetic_result

from ..conftest import wait_for

HONEST = "import torch\n\ndef kernel(x, weight):\n    return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps=1e-6)\n"
PASSWORD = "correct-horse-battery"


@pytest.fixture(autouse=True)
def fast_passwords(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def signing_key(tmp_path, settings):
    settings.DYNO_SIGNING_KEY_PATH = str(tmp_path / "keys" / "report-signing.pem")
    return settings.DYNO_SIGNING_KEY_PATH


@pytest.fixture
def people(make_org, make_member):
    org = make_org("acme", owner="owner@acme.test")
    make_member(org, "auditor@audit.test", "auditor")
    return org


def _auditor(org) -> Actor:
    from django.contrib.auth import get_user_model

    return Actor(user=get_user_model().objects.get(username="auditor@audit.test"), roles={org.pk: "auditor"})


def _audit_run(org, result: dict | None = None, **fields) -> Run:
    """A succeeded audit of a submitted rmsnorm candidate, as the worker leaves it."""
    result = result or synthetic_result(model=None, speedups={"rmsnorm": 1.05}, verdict="accepted")
    return Run.objects.create(
        organization=org, kind=RunKind.AUDIT, workload="rmsnorm", candidate_source=HONEST,
        candidate_sha256=hashlib.sha256(HONEST.encode()).hexdigest(), hardware="cpu", profile="cpu-ci",
        status=Status.SUCCEEDED, stage=Stage.DONE, progress=1.0, finished_at=FINISHED_AT, result=result,
        verdict=result.get("verdict", ""), stable=True, **fields)


def _model_run(org, **fields) -> Run:
    from catalog.models import Model, ModelVersion

    model = Model.objects.create(organization=org, name="tiny")
    version = ModelVersion.objects.create(model=model, number=1, kind="weights", family="llama",
                                          architecture="LlamaForCausalLM", parameter_count=1000, dtype="float32",
                                          config={}, storage_dir="models/x", total_bytes=1)
    return Run.objects.create(organization=org, model_version=version, hardware="cpu", profile="cpu-ci", batch=2,
                              seq=16, status=Status.SUCCEEDED, stage=Stage.DONE, finished_at=FINISHED_AT,
                              result=synthetic_result(), artifact_sha256="af" * 32, **fields)


# --- the comparison (pure) ------------------------------------------------------------------------


def _body(**result_kwargs) -> dict:
    return {"result": synthetic_result(**result_kwargs), "billing": {"calibration_stable": True},
            "suite": {"manifest_sha256": "ab" * 32}}


def test_it_compares_each_figure_with_the_original_interval():
    # The original: rmsnorm 1.62 [1.539, 1.6848], gemm 1.04 [0.988, 1.0816], model 1.31 [1.22, 1.40].
    original = _body()
    reaudit = _body(speedups={"rmsnorm": 1.539, "gemm": 1.20, "attention_prefill": 0.98}, model=(1.25, 1.2, 1.3))
    data = reaudit_dict(compare_bodies(original, reaudit))
    figures = {f["label"].split()[0]: f for f in data["figures"]}
    assert list(figures) == ["whole", "rmsnorm", "gemm", "attention_prefill"]
    model = figures["whole"]
    assert model["whole_model"] is True and model["within_original_ci"] is True
    assert model["original"] == {"speedup": 1.31, "ci95": [1.22, 1.40], "verdict": None}
    assert model["difference"] == pytest.approx(-0.06) and model["difference_percent"] == pytest.approx(-4.58, abs=0.01)
    assert figures["rmsnorm"]["within_original_ci"] is True  # on the lower bound counts as inside
    assert figures["gemm"]["within_original_ci"] is False and figures["gemm"]["intervals_overlap"] is False
    assert figures["gemm"]["original"]["verdict"] == "accepted" and figures["gemm"]["reaudit"]["verdict"] == "accepted"
    assert data["all_within_original_ci"] is False


def test_it_leaves_out_a_missing_model_figure_and_says_nothing_of_what_was_not_measured():
    original = _body(model=None, speedups={"rmsnorm": 1.1})
    reaudit = _body(model=None, speedups={"softmax": 1.3})
    comparison = compare_bodies(original, reaudit)
    data = reaudit_dict(comparison)
    assert [f["whole_model"] for f in data["figures"]] == [False, False]  # no model row for audits
    by_label = {f["label"].split()[0]: f for f in data["figures"]}
    assert by_label["rmsnorm"]["reaudit"]["speedup"] is None and by_label["rmsnorm"]["difference"] is None
    assert by_label["rmsnorm"]["within_original_ci"] is None
    assert by_label["softmax"]["original"]["ci95"] is None and by_label["softmax"]["within_original_ci"] is None
    assert data["all_within_original_ci"] is False  # nothing was checked, so nothing is confirmed


# --- dispatching -------------------------------------------------------------------------------


@pytest.mark.django_db
def test_it_starts_one_run_repeating_the_audit_however_often_it_is_dispatched(
        people, django_capture_on_commit_callbacks):
    original = _audit_run(people)
    report = report_create_for_run(run=original)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        request = reaudit_request(actor=_auditor(people), report=report, reason="driver updated")
    assert len(callbacks) == 1  # the dispatch, sent once the request commits
    with django_capture_on_commit_callbacks(execute=False) as sent:
        run = reaudit_dispatch(request_id=request.pk)
        assert reaudit_dispatch(request_id=request.pk) is None
        assert reports_sweep()["started"] == []
    assert len(sent) == 1  # one run message, not three
    assert Run.objects.exclude(pk=original.pk).count() == 1
    request.refresh_from_db()
    assert request.status == "running" and request.run_id == run.pk
    same = ("kind", "workload", "candidate_source", "candidate_sha256", "hardware", "profile", "organization_id")
    assert {f: getattr(run, f) for f in same} == {f: getattr(original, f) for f in same}
    assert run.status == "queued" and run.created_by == request.requested_by
    assert "re-audit" in run.events.first().message


@pytest.mark.django_db
def test_it_repeats_a_model_run_with_its_version_batch_and_seq(people, django_capture_on_commit_callbacks):
    original = _model_run(people)
    report = report_create_for_run(run=original)
    with django_capture_on_commit_callbacks(execute=False):
        request = reaudit_request(actor=_auditor(people), report=report, reason="check")
        run = reaudit_dispatch(request_id=request.pk)
    assert (run.kind, run.model_version_id, run.batch, run.seq, run.hardware) == (
        "model", original.model_version_id, 2, 16, "cpu")
    assert run.repeat_of_id == original.pk


@pytest.mark.django_db
def test_a_model_reaudit_replays_the_artifact_its_run_measured(people, django_capture_on_commit_callbacks,
                                                               monkeypatch):
    import pipeline.model_run
    from fleet.control_api import _job
    from fleet.control_client import ControlClient
    from runs.runner import _execute_model

    artifact = {"schema": "dyno.optimization-artifact/1", "audited": {"rmsnorm-x": HONEST}}
    original = _model_run(people, artifact=artifact)
    report = report_create_for_run(run=original)
    with django_capture_on_commit_callbacks(execute=False):
        run = reaudit_dispatch(request_id=reaudit_request(actor=_auditor(people), report=report, reason="check").pk)
    asked = {}

    def stop_here(model_dir, **kwargs):
        asked.update(kwargs)
        raise RuntimeError("stop here")

    monkeypatch.setattr(pipeline.model_run, "run_model_pipeline", stop_here)
    job = _job(Run.objects.get(pk=run.pk))  # what the runner's claim hands it
    assert job["replay"] == artifact
    job["model_files"] = []  # nothing to fetch: the pipeline stops before it reads the model
    with pytest.raises(RuntimeError, match="stop here"):
        _execute_model(job, "cpu", lambda *a: None, worker="w@host", control=ControlClient("http://127.0.0.1:9", "unused"))
    assert asked["replay"] == artifact


@pytest.mark.django_db(transaction=True)
def test_two_concurrent_dispatchers_start_one_run(people, broker_clean):
    import redis

    report = report_create_for_run(run=_audit_run(people))
    request = ReauditRequest.objects.create(organization=people, report=report, requested_by="x", reason="race")
    barrier, started = threading.Barrier(2), []

    def dispatch() -> None:
        try:
            barrier.wait()
            started.append(reaudit_dispatch(request_id=request.pk))
        finally:
            connection.close()

    threads = [threading.Thread(target=dispatch) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(run is not None for run in started) == 1
    assert Run.objects.filter(kind="audit").count() == 2  # the original and one re-audit
    assert redis.Redis.from_url(broker_clean).llen("cpu") == 1  # and one message on the cpu queue


@pytest.mark.django_db
def test_it_fails_the_request_when_the_hardware_is_no_longer_served(people, settings):
    report = report_create_for_run(run=_audit_run(people))
    request = ReauditRequest.objects.create(organization=people, report=report, requested_by="x", reason="check")
    settings.DYNO_HARDWARE_CLASSES = ["gpu-h200"]
    assert reaudit_dispatch(request_id=request.pk) is None
    request.refresh_from_db()
    assert request.status == "failed" and "no longer served" in request.error
    assert Run.objects.count() == 1


@pytest.mark.django_db
def test_a_failed_or_cancelled_reaudit_run_fails_its_request_and_leaves_the_dispute_open(
        people, django_capture_on_commit_callbacks):
    report = report_create_for_run(run=_audit_run(people))
    owner = Actor(roles={people.pk: "owner"})
    with django_capture_on_commit_callbacks(execute=False):
        dispute = report_dispute(actor=owner, report=report, reason="too good")
        run = reaudit_dispatch(request_id=dispute.reaudit_id)
    run_claim(run_id=run.pk, worker="w1@host")
    assert run_fail(run_id=run.pk, worker="w1@host", error="sandbox could not start")
    dispute.refresh_from_db()
    assert dispute.reaudit.status == "failed" and "sandbox could not start" in dispute.reaudit.error
    assert dispute.status == "open"
    # The customer whose report it re-audits cannot withdraw it half-way; an operator can, and the
    # request then fails the same way.
    with django_capture_on_commit_callbacks(execute=False):
        again = reaudit_request(actor=_auditor(people), report=report, reason="again")
        run = reaudit_dispatch(request_id=again.pk)
    with pytest.raises(RunRejected, match="only an operator can stop it"):
        run_cancel(actor=owner, run=run)
    assert Run.objects.get(pk=run.pk).status == "queued"
    run_cancel(actor=Actor(is_staff=True), run=run)
    again.refresh_from_db()
    assert again.status == "failed" and "cancelled" in again.error


@pytest.mark.django_db
def test_the_sweep_settles_what_a_lost_message_left(people, django_capture_on_commit_callbacks):
    report = report_create_for_run(run=_audit_run(people))
    with django_capture_on_commit_callbacks(execute=False):
        request = reaudit_request(actor=_auditor(people), report=report, reason="check")
    # The dispatch message was lost: the sweep starts it.
    with django_capture_on_commit_callbacks(execute=False):
        assert reports_sweep()["started"] == [str(request.pk)]
    request.refresh_from_db()
    # The run failed without its hook (a crash between): the sweep fails the request.
    Run.objects.filter(pk=request.run_id).update(status=Status.FAILED, error="worker lost")
    assert reports_sweep()["failed"] == [str(request.pk)]
    request.refresh_from_db()
    assert request.status == "failed" and "worker lost" in request.error
    # A succeeded run whose report message was lost gets its report asked for again, once made it is not.
    orphan = _audit_run(people)
    assert runs_missing_report(before=FINISHED_AT.replace(minute=59)) == [orphan.pk]
    with django_capture_on_commit_callbacks(execute=False):
        assert reports_sweep(now=FINISHED_AT.replace(minute=59))["reports"] == [str(orphan.pk)]
    report_create(str(orphan.pk))
    assert reports_sweep(now=FINISHED_AT.replace(minute=59))["reports"] == []


@pytest.mark.django_db
def test_the_reaudit_report_supersedes_and_shows_beside_the_original(
        client, people, make_key, django_capture_on_commit_callbacks):
    original = report_create_for_run(run=_audit_run(people))
    with django_capture_on_commit_callbacks(execute=False):
        request = reaudit_request(actor=_auditor(people), report=original, reason="driver updated")
        run = reaudit_dispatch(request_id=request.pk)
    # What the worker does: claim, measure, store; the report is made on the control queue.
    run_claim(run_id=run.pk, worker="w1@host")
    remeasured = synthetic_result(model=None, speedups={"rmsnorm": 1.30}, verdict="accepted", seed=3)
    with django_capture_on_commit_callbacks(execute=False):
        assert run_succeed(run_id=run.pk, worker="w1@host", result=remeasured)
    new = report_create_for_run(run=Run.objects.get(pk=run.pk))
    request.refresh_from_db()
    assert new.kind == "reaudit" and new.supersedes_id == original.pk
    assert request.status == "completed" and request.result_report_id == new.pk

    assert client.login(username="auditor@audit.test", password=PASSWORD)
    for page_of in (original, new):
        page = client.get(f"/reports/{page_of.pk}").content.decode()
        assert "Re-audit beside the original" in page and f'id="reaudit-{new.pk}"' in page
        # rmsnorm: 1.05 [0.9975, 1.092] then 1.30: outside, and said so.
        assert "1.050x [0.998, 1.092]" in page and "1.300x" in page and "0.250 (23.8%)" in page
        assert "some re-measured figures lie outside the original 95% CI" in page
    assert client.get(f"/reports/{new.pk}/report.pdf").status_code == 200  # the PDF carries the table too

    key = make_key(people, scope="auditor")
    data = client.get(f"/api/v1/reports/{original.pk}/reaudit", HTTP_AUTHORIZATION=f"Bearer {key}").json()
    assert data["reaudits"][0]["status"] == "completed" and data["reaudits"][0]["result_report"] == str(new.pk)
    (figure,) = data["superseded_by"]["figures"]
    assert figure["original"]["speedup"] == 1.05 and figure["reaudit"]["speedup"] == 1.30
    assert figure["within_original_ci"] is False and figure["difference"] == pytest.approx(0.25)
    assert data["supersedes"] is None
    mirrored = client.get(f"/api/v1/reports/{new.pk}/reaudit", HTTP_AUTHORIZATION=f"Bearer {key}").json()
    assert mirrored["supersedes"]["figures"] == data["superseded_by"]["figures"]


# --- on a real worker ----------------------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_an_auditors_reaudit_runs_on_the_worker_and_shows_beside_the_original(
        client, people, start_worker, signing_key):
    from runs.services import audit_start

    start_worker(DYNO_SIGNING_KEY_PATH=signing_key)
    first = audit_start(actor=Actor(roles={people.pk: "owner"}), organization_id=people.pk, workload="rmsnorm",
                        source=HONEST, hardware="cpu")
    original = wait_for(lambda: Report.objects.filter(run_id=first.pk).first(), timeout=120, interval=0.5,
                        what="the audit's report")
    assert original.kind == "audit"

    assert client.login(username="auditor@audit.test", password=PASSWORD)
    response = client.post(f"/reports/{original.pk}/reaudit", {"reason": "driver updated; does it still hold?"})
    assert response.status_code == 302
    request = ReauditRequest.objects.get(report=original)

    def completed():
        request.refresh_from_db()
        return request.status in ("completed", "failed") and request

    wait_for(completed, timeout=150, interval=0.5, what="the re-audit to finish")
    assert request.status == "completed", (request.error, request.run and request.run.error)
    rerun = request.run
    assert rerun.pk != first.pk and rerun.status == "succeeded"
    assert (rerun.kind, rerun.workload, rerun.candidate_sha256, rerun.profile, rerun.hardware) == (
        "audit", "rmsnorm", first.candidate_sha256, first.profile, first.hardware)
    new = request.result_report
    assert new.kind == "reaudit" and new.supersedes_id == original.pk and new.run_id == rerun.pk
    body = json.loads(new.body_bytes)
    assert body["supersedes"]["report_sha256"] == original.body_sha256

    page = client.get(f"/reports/{original.pk}").content.decode()
    assert "Superseded by the re-audit" in page and f'id="reaudit-{new.pk}"' in page
    comparison = compare_bodies(json.loads(original.body_bytes), body)
    (row,) = comparison.figures
    assert row.old_speedup is not None and row.new_speedup is not None
    assert f"{row.new_speedup:.3f}x" in page and ("inside" if row.within_old_ci else "outside") in page
