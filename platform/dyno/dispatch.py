"""Celery tasks sent by name: the web tier and the services publish work without importing the task
modules that execute it (those run on other hosts and load the harness), so no service module
imports a task module and no import cycle runs through them.
"""

from __future__ import annotations

import logging

import kombu.exceptions
from celery import current_app
from django.db import transaction

log = logging.getLogger(__name__)

RUN_EXECUTE = "runs.execute"
REPORT_CREATE = "reports.create_for_run"
REAUDIT_START = "reports.reaudit_dispatch"


def send(name: str, *args: str, queue: str, **options) -> None:
    """Publish task `name` with `args` to `queue` (raises kombu's OperationalError when the broker
    stays unreachable after the publish's own retries)."""
    current_app.send_task(name, args=list(args), queue=queue, **options)


def _publish_quietly(name: str, argument: str, what: str) -> None:
    try:
        send(name, argument, queue="control")
    except (kombu.exceptions.KombuError, OSError) as exc:  # whatever the transport raises: the row is committed
        log.error("%s %s not queued (broker unreachable: %s); the reports sweep will do it", what, argument, exc)


def report_enqueue(run_id) -> None:
    """Ask for a succeeded run's report once the caller's transaction commits; a message the broker
    did not take is found by the reports sweep."""
    transaction.on_commit(lambda: _publish_quietly(REPORT_CREATE, str(run_id), "report of run"))


def reaudit_enqueue(request_id) -> None:
    """Start a re-audit request once the transaction that opened it commits."""
    transaction.on_commit(lambda: _publish_quietly(REAUDIT_START, str(request_id), "re-audit"))
