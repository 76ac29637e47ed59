"""A runner calibrates itself when it starts (A/A audits on its own direct queue), the fleet page
shows the verdict, and a report measured on a runner whose calibration failed does not bill."""

from __future__ import annotations

import pytest

from fleet.models import Runner

from ..conftest import wait_for


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_a_starting_runner_calibrates_itself_and_the_fleet_page_shows_it(start_worker, admin_client):
    worker = start_worker(DYNO_RUNNER_CALIBRATION="cpu-ci", DYNO_RUNNER_CALIBRATION_WORKLOADS="rmsnorm")
    runner = wait_for(lambda: Runner.objects.filter(hostname=worker.name, calibration__isnull=False).first(),
                      timeout=150, interval=0.5, what="the runner's calibration")
    calibration = runner.calibration
    assert calibration["schema"] == "dyno.calibration/1" and calibration["profile"] == "cpu-ci"
    (row,) = calibration["workloads"]
    assert row["key"].startswith("rmsnorm[") and row["aa_ci95"] and row["baseline_verdict"] in ("accepted", "rejected")
    assert calibration["verdict"]["billable"] == (row["stable"] and row["baseline_verdict"] == "accepted")
    page = admin_client.get("/fleet").content.decode()
    assert ("billable" if runner.calibration_billable else "not billable") in page
    assert calibration["verdict"]["message"][:40] in page


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_a_run_waiting_when_its_runner_starts_is_measured_after_the_runner_calibrates(make_org, start_worker):
    """A run already queued when a runner starts is consumed before (or beside) the runner's own
    calibration task: the run calibrates the runner first, so its result carries this start's
    calibration rather than "not calibrated" (which did not bill: a payer's lever)."""
    from accounts.selectors import Actor
    from runs.models import Run, RunEvent
    from runs.services import audit_start

    from .test_audits import HONEST

    org = make_org()
    run = audit_start(actor=Actor(roles={org.pk: "owner"}), organization_id=org.pk, workload="rmsnorm",
                      source=HONEST, hardware="cpu")
    worker = start_worker(DYNO_RUNNER_CALIBRATION="cpu-ci", DYNO_RUNNER_CALIBRATION_WORKLOADS="rmsnorm")
    wait_for(lambda: Run.objects.get(pk=run.pk).finished, timeout=300, interval=1, what="the audit")
    run.refresh_from_db()
    assert run.status == "succeeded", run.error
    stored = run.result["environment"]["runner_calibration"]
    assert stored["profile"] == "cpu-ci" and stored["calibrated_at"], stored
    runner = Runner.objects.get(hostname=worker.name)
    assert runner.calibration["profile"] == "cpu-ci"
    # Calibrated once in this start, whichever process took it first.
    notes = list(RunEvent.objects.filter(run=run, message__startswith="calibrating this runner").values_list("at", flat=True))
    if notes:  # the run took it: the runner's calibration was stored after the note, before the result
        assert notes[0] <= runner.calibrated_at <= run.finished_at


def test_a_result_from_a_runner_that_failed_calibration_signs_but_does_not_bill():
    from reports.document import billing_statement, model_figure
    from tests.reports.builders import synthetic_result

    result = synthetic_result(seed=3, model=(1.3, 1.2, 1.4))
    assert model_figure(result).billable.billable
    result["environment"]["runner_calibration"] = {"billable": False, "profile": "cpu-ci",
                                                   "message": "figures measured here will not bill: ..."}
    figure = model_figure(result)
    assert not figure.billable.billable and figure.billable.reason.value == "runner_not_calibrated"
    # The signed billing block names it, which metering reads to refuse a deployment under it.
    assert "runner_not_calibrated" in {r["code"] for r in billing_statement(result)["reasons"]}
    # Passing (or never run) calibrations leave the figure alone.
    result["environment"]["runner_calibration"]["billable"] = True
    assert model_figure(result).billable.billable
    del result["environment"]["runner_calibration"]
    assert model_figure(result).billable.billable


def test_gpu_kernel_figures_timed_by_the_candidate_s_own_process_do_not_bill():
    """A kernel audit on a GPU bills CUDA events the worker recorded: the candidate's own process,
    which could report any time that fits its host interval. Such figures sign but never bill; a
    CUDA result that does not say where its times came from counts as that kind."""
    from reports.document import UNTRUSTED, billing_statement, kernel_clock_trusted
    from tests.reports.builders import synthetic_result

    result = synthetic_result(seed=5, model=(1.3, 1.2, 1.4))
    billable = [w["billable"] for w in billing_statement(result)["workloads"]]
    assert any(billable)  # the synthetic kernels bill on the host clock
    for environment in ({"device": "cuda", "kernel_clock": "cuda-events-in-worker"}, {"device": "cuda:1"}):
        result["environment"].pop("kernel_clock", None)
        result["environment"].update(environment)
        assert not kernel_clock_trusted(result)
        rows = billing_statement(result)["workloads"]
        assert not any(w["billable"] for w in rows)
        assert {w["reason"] for w in rows if w["ci95_low"] is not None} <= {"device_clock_untrusted"}
    assert "device_clock_untrusted" in UNTRUSTED
    result["environment"]["kernel_clock"] = "host"
    assert kernel_clock_trusted(result) and [w["billable"] for w in billing_statement(result)["workloads"]] == billable


def test_the_runner_marks_its_kernel_clock_and_cuda_kernel_figures_unbillable():
    from runners.evaluate import WORKER_CUDA_EVENTS, kernel_clock

    assert kernel_clock("cpu") == "host"
    assert kernel_clock("cuda") == kernel_clock("cuda:0") == WORKER_CUDA_EVENTS
