"""A run's stored result is evidence for signed reports: refused through the ORM, raw SQL and the admin."""

from __future__ import annotations

import pytest
from django.db import DatabaseError, IntegrityError, connection, transaction

from accounts.selectors import Actor
from runs.models import Run, WorkloadResult
from runs.services import run_claim, run_start, run_succeed
from tests.reports.builders import synthetic_result

from .helpers import upload_version

pytestmark = pytest.mark.django_db


@pytest.fixture
def succeeded(make_org, sample_models, media_root, django_capture_on_commit_callbacks):
    org = make_org()
    version = upload_version(org=org, folder=sample_models["llama"])
    with django_capture_on_commit_callbacks(execute=False):
        run = run_start(actor=Actor(roles={org.pk: "owner"}), version=version, hardware="cpu")
        run_claim(run_id=run.pk, worker="w1@host")
        assert run_succeed(run_id=run.pk, worker="w1@host", inventory={},
                           result=synthetic_result(model=None, speedups={"rmsnorm": 1.30}, verdict="accepted", seed=3),
                           artifact={"schema": "dyno.optimization-artifact/1", "kernels": []})
    return Run.objects.get(pk=run.pk)


def _refused(statement: str, params: list, match: str) -> None:
    with pytest.raises(DatabaseError, match=match), transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(statement, params)


def test_it_refuses_changes_to_a_stored_result(succeeded):
    row = succeeded.workload_results.first()
    assert row is not None
    with pytest.raises(IntegrityError, match="never change"), transaction.atomic():
        Run.objects.filter(pk=succeeded.pk).update(model_ci_low=9.0)
    _refused("UPDATE runs_run SET result = '{}'::jsonb WHERE id = %s", [succeeded.pk], "never change")
    _refused("UPDATE runs_run SET artifact = NULL WHERE id = %s", [succeeded.pk], "never change")
    _refused("UPDATE runs_run SET hardware = 'gpu-h200' WHERE id = %s", [succeeded.pk], "never change")
    _refused("DELETE FROM runs_run WHERE id = %s", [succeeded.pk], "DELETE refused")
    _refused("UPDATE runs_workloadresult SET speedup = 9 WHERE id = %s", [row.pk], "stored once")
    _refused("DELETE FROM runs_workloadresult WHERE id = %s", [row.pk], "stored once")
    # What is not evidence still moves: a progress note, the heartbeat.
    Run.objects.filter(pk=succeeded.pk).update(error="note")
    fresh = Run.objects.get(pk=succeeded.pk)
    assert fresh.result == succeeded.result and fresh.model_ci_low == succeeded.model_ci_low
    assert WorkloadResult.objects.get(pk=row.pk).speedup == row.speedup


def test_it_lets_a_run_without_a_result_change_and_go(make_org, sample_models, media_root, django_capture_on_commit_callbacks):
    org = make_org()
    version = upload_version(org=org, folder=sample_models["llama"])
    with django_capture_on_commit_callbacks(execute=False):
        run = run_start(actor=Actor(roles={org.pk: "owner"}), version=version, hardware="cpu")
    Run.objects.filter(pk=run.pk).update(hardware="gpu-h100", progress=0.5)
    assert Run.objects.get(pk=run.pk).hardware == "gpu-h100"


def test_it_shows_a_run_read_only_in_the_admin(succeeded, django_user_model, client):
    admin = django_user_model.objects.create_superuser("root@dyno.test", "root@dyno.test", "a-long-password-1")
    client.force_login(admin)
    page = client.get(f"/admin/runs/run/{succeeded.pk}/change/")
    assert page.status_code == 200 and b'name="_save"' not in page.content
    assert b"rmsnorm" in page.content  # the workload rows are shown
    posted = client.post(f"/admin/runs/run/{succeeded.pk}/change/", {"result": "{}", "model_ci_low": "9"})
    assert posted.status_code == 403
    assert client.post(f"/admin/runs/run/{succeeded.pk}/delete/", {"post": "yes"}).status_code == 403
    assert client.get("/admin/runs/run/add/").status_code == 403
    assert Run.objects.get(pk=succeeded.pk).model_ci_low == succeeded.model_ci_low
