"""Celery tasks of metering: the monthly billing run (beat), thin over billing.billing_run_create."""

from __future__ import annotations

import logging

from celery import shared_task
from django.utils import timezone

from metering.billing import billing_run_create
from metering.errors import BillingError
from metering.periods import Period

log = logging.getLogger(__name__)


@shared_task(name="metering.bill_previous_month")
def bill_previous_month() -> str:
    """Bill the month that ended; a second delivery finds the run and changes nothing."""
    period = Period.of(timezone.now()).previous()
    try:
        run, created = billing_run_create(period=period, actor="system:beat")
    except BillingError as exc:
        # Out of order or too early: finance must act (e.g. bill an earlier month first); say so loudly.
        log.error("billing run for %s refused: %s (%s)", period, exc.message, exc.code)
        raise
    log.info("billing run for %s: %s (%s invoices)", period, "created" if created else "already existed",
             run.summary.get("invoices"))
    return str(run.pk)
