"""/metrics: what an operator's Prometheus scrapes, behind its own bearer token."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from runs.models import Run, RunEvent, WorkloadResult
from runs.status import Stage, Status

pytestmark = pytest.mark.django_db
LINE = re.compile(r'^[a-z_]+(\{([a-z_]+="[^"]*",?)*\})? -?[0-9.e+-]+$')


def _run_through_stages(org, version, stages: list[tuple[str, int]], *, status=Status.SUCCEEDED) -> Run:
    start = timezone.now() - timedelta(minutes=30)
    run = Run.objects.create(organization=org, model_version=version, hardware="cpu", profile="cpu-ci", batch=1,
                             seq=8, status=Status.QUEUED, stage=Stage.WAITING)
    at = start
    for stage, seconds in stages:
        event = RunEvent.objects.create(run=run, stage=stage, message=f"entered {stage}")
        RunEvent.objects.filter(pk=event.pk).update(at=at)
        at += timedelta(seconds=seconds)
    Run.objects.filter(pk=run.pk).update(status=status, finished_at=at, started_at=start)
    return run


def test_it_does_not_exist_without_a_token_and_refuses_a_wrong_one(client, settings):
    settings.DYNO_METRICS_TOKEN = ""
    assert client.get("/metrics").status_code == 404
    settings.DYNO_METRICS_TOKEN = "s3cret-token"
    refused = client.get("/metrics", HTTP_AUTHORIZATION="Bearer guess")
    assert refused.status_code == 401 and refused["WWW-Authenticate"] == "Bearer"
    assert b"s3cret" not in refused.content


def test_it_exposes_queues_runs_stage_durations_and_billing_in_prometheus_text(client, settings, make_org):
    from catalog.models import Model, ModelVersion

    settings.DYNO_METRICS_TOKEN = "s3cret-token"
    org = make_org()
    model = Model.objects.create(organization=org, name="tiny")
    version = ModelVersion.objects.create(model=model, number=1, kind="weights", family="llama",
                                          architecture="LlamaForCausalLM", parameter_count=1000, dtype="float32",
                                          config={}, storage_dir="models/x", total_bytes=1)
    _run_through_stages(org, version, [("profile", 10), ("optimize", 40), ("audit", 20), ("store", 2)])
    _run_through_stages(org, version, [("profile", 30), ("optimize", 60)], status=Status.FAILED)
    queued = Run.objects.create(organization=org, model_version=version, hardware="cpu", profile="cpu-ci", batch=1, seq=8)
    for verdict, reasons in (("rejected", [{"code": "timing.clock_mismatch", "message": "m"},
                                           {"code": "integrity.background_cpu", "message": "m"}]),
                             ("rejected", [{"code": "timing.clock_mismatch", "message": "m"}]),
                             ("accepted", []), ("accepted", {"not": "a list"})):
        WorkloadResult.objects.create(run=queued, name="rmsnorm", family="norm", dtype="float32", verdict=verdict,
                                      reasons=reasons)
    response = client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret-token")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/plain; version=0.0.4")
    text = response.content.decode()
    samples = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert samples and all(LINE.match(line) for line in samples), [s for s in samples if not LINE.match(s)]
    assert 'dyno_runs{status="succeeded"} 1' in samples and 'dyno_runs{status="queued"} 1' in samples
    assert 'dyno_run_stage_seconds_count{stage="profile"} 2' in samples
    assert 'dyno_run_stage_seconds_sum{stage="optimize"} 100' in samples  # 40 s, and 60 s until the failure
    assert 'dyno_run_stage_seconds{stage="profile",quantile="0.5"} 20' in samples
    assert 'dyno_runners_online{hardware="cpu"} 0' in samples
    assert "dyno_usage_events_total 0" in samples and "dyno_billing_runs_total 0" in samples
    assert any(line.startswith('dyno_queue_depth{queue="cpu"} ') for line in samples)  # read from the broker
    assert 'dyno_audit_verdicts_total{verdict="rejected"} 2' in samples
    assert 'dyno_audit_reasons_total{code="timing.clock_mismatch"} 2' in samples
    assert 'dyno_audit_reasons_total{code="integrity.background_cpu"} 1' in samples
