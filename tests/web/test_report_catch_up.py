"""The reports sweep asks for every missing report, however old, not only a day's: a run whose
report was lost while the control worker was down for days still gets one."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from reports.selectors import runs_missing_report

pytestmark = pytest.mark.django_db


def _succeeded(org, version, *, ago: timedelta, now):
    from runs.models import Run

    return Run.objects.create(organization=org, model_version=version, hardware="cpu", status="succeeded",
                              result={"schema": "dyno.suite-result/1"}, finished_at=now - ago)


@pytest.fixture
def version(make_org):
    from catalog.models import Model, ModelVersion

    model = Model.objects.create(organization=make_org(), name="llama")
    return ModelVersion.objects.create(model=model, number=1, kind="weights", family="llama",
                                       architecture="LlamaForCausalLM", parameter_count=1000, dtype="float32",
                                       config={}, storage_dir="/nonexistent/catch-up")


def test_it_finds_missing_reports_of_any_age_the_last_day_first(version):
    now = timezone.now()
    org = version.model.organization
    month_old = _succeeded(org, version, ago=timedelta(days=30), now=now)
    days_old = _succeeded(org, version, ago=timedelta(days=3), now=now)
    fresh = _succeeded(org, version, ago=timedelta(hours=2), now=now)
    _succeeded(org, version, ago=timedelta(seconds=10), now=now)  # inside the grace: its task may still run
    assert runs_missing_report(before=now - timedelta(minutes=1)) == [fresh.pk, month_old.pk, days_old.pk]
    assert runs_missing_report(before=now - timedelta(minutes=1), limit=1) == [fresh.pk]


def test_the_sweep_enqueues_an_old_missing_report(version, django_capture_on_commit_callbacks):
    from reports.services import reports_sweep

    old = _succeeded(version.model.organization, version, ago=timedelta(days=10), now=timezone.now())
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        assert reports_sweep()["reports"] == [str(old.pk)]
    assert len(callbacks) == 1
