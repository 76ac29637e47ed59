"""Celery interface of reports: sign a succeeded run's report, start re-audits and sweep up
what a lost message left undone, all on the `control` queue.

Signing happens on platform workers only: runner (hardware) workers never load the signing key.
Safe to deliver twice: the services return what a first delivery made. Publishing happens after
commit and never raises into the caller: a message the broker did not take is found by the sweep.
"""

from __future__ import annotations

import logging

import kombu.exceptions
from celery import shared_task
from django.db import IntegrityError, InterfaceError, OperationalError, transaction

from reports.document import ReportError
from reports.services import reaudit_dispatch, reaudit_run_ended, report_create_for_run, reports_sweep
from runs.models import Run

log = logging.getLogger(__name__)


# IntegrityError: two re-audits of one chain raced for the same head; a retry supersedes the winner.
@shared_task(name="reports.create_for_run", acks_late=True, autoretry_for=(IntegrityError, OperationalError),
             retry_backoff=True, max_retries=3)
def report_create(run_id: str) -> str:
    try:
        report = report_create_for_run(run=Run.objects.get(pk=run_id))
    except ReportError as exc:
        # Retrying cannot fix the run's data; a re-audit waiting on this report fails with why.
        reaudit_run_ended(run_id=run_id, error=f"the re-audit run {run_id} succeeded but its report could not "
                                               f"be made: {exc}")
        raise
    return str(report.pk)


@shared_task(name="reports.reaudit_dispatch", acks_late=True, autoretry_for=(OperationalError, InterfaceError),
             retry_backoff=True, max_retries=3)
def reaudit_start(request_id: str) -> str | None:
    run = reaudit_dispatch(request_id=request_id)
    return None if run is None else str(run.pk)


@shared_task(name="reports.sweep")
def sweep() -> dict[str, list[str]]:
    return reports_sweep()


def _publish(task, request_id_or_run_id: str, what: str) -> None:
    try:
        task.apply_async(args=[request_id_or_run_id], queue="control")
    except kombu.exceptions.OperationalError as exc:
        log.error("%s %s not queued (broker unreachable: %s); the reports sweep will do it", what,
                  request_id_or_run_id, exc)


def report_enqueue(run_id) -> None:
    """Call from the run pipeline inside the transaction that marks the run succeeded."""
    transaction.on_commit(lambda: _publish(report_create, str(run_id), "report of run"))


def reaudit_enqueue(request_id) -> None:
    """Call inside the transaction that opens a re-audit request: it starts once that commits."""
    transaction.on_commit(lambda: _publish(reaudit_start, str(request_id), "re-audit"))
