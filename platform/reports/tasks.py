"""Celery interface of reports: sign a succeeded run's report, start re-audits and sweep up
what a lost message left undone, all on the `control` queue.

Signing happens on platform workers only: runner (hardware) workers never load the signing key.
Safe to deliver twice: the services return what a first delivery made. The services publish these
by name (dyno.dispatch), after commit; a message the broker did not take is found by the sweep.
"""

from __future__ import annotations

import logging

from celery import shared_task
from django.db import IntegrityError, InterfaceError, OperationalError

from dyno.dispatch import REAUDIT_START, REPORT_CREATE
from reports.document import ReportError
from reports.services import reaudit_dispatch, reaudit_run_ended, report_create_for_run, reports_sweep
from runs.models import Run

log = logging.getLogger(__name__)


# IntegrityError: two re-audits of one chain raced for the same head; a retry supersedes the winner.
@shared_task(name=REPORT_CREATE, acks_late=True, autoretry_for=(IntegrityError, OperationalError),
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


@shared_task(name=REAUDIT_START, acks_late=True, autoretry_for=(OperationalError, InterfaceError),
             retry_backoff=True, max_retries=3)
def reaudit_start(request_id: str) -> str | None:
    run = reaudit_dispatch(request_id=request_id)
    return None if run is None else str(run.pk)


@shared_task(name="reports.sweep")
def sweep() -> dict[str, list[str]]:
    return reports_sweep()
