"""Celery interface of reports: sign a succeeded run's report on the `control` queue.

Signing happens on platform workers only: runner (hardware) workers never load the signing key.
Safe to deliver twice: the service returns the report a first delivery made.
"""

from __future__ import annotations

from celery import shared_task
from django.db import IntegrityError, transaction

from reports.services import report_create_for_run
from runs.models import Run


# IntegrityError: two re-audits of one chain raced for the same head; a retry supersedes the winner.
@shared_task(name="reports.create_for_run", acks_late=True, autoretry_for=(IntegrityError,),
             retry_backoff=True, max_retries=3)
def report_create(run_id: str) -> str:
    report = report_create_for_run(run=Run.objects.get(pk=run_id))
    return str(report.pk)


def report_enqueue(run_id) -> None:
    """Call from the run pipeline inside the transaction that marks the run succeeded."""
    transaction.on_commit(lambda: report_create.apply_async(args=[str(run_id)], queue="control"))
