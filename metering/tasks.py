"""Celery tasks of metering: the billing runs of closed months (beat, hourly), thin over
billing.billing_run_create.

Every tick bills each closed month that is due and unbilled, oldest first, so a month whose
moment passed while the control worker or beat was down is billed by the next tick that runs,
and the month after it is not refused as `previous_period_unbilled`.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from celery import shared_task
from django.utils import timezone

from metering.billing import billing_run_create
from metering.errors import BillingError
from metering.models import BillingRun
from metering.periods import Period

log = logging.getLogger(__name__)

# A month is billed from 03:00 UTC on the 3rd of the next, not the 1st: most of its late usage has
# arrived by then (what arrives later is billed as an adjustment of the next run).
BILL_AFTER = timedelta(days=2, hours=3)


def periods_due(*, latest: Period | None, now: datetime) -> list[Period]:
    """The months to bill now, oldest first: every month after the last billed one whose billing
    moment has passed; with none billed yet, only the month before `now`'s (once due), as the
    first run takes all earlier usage."""
    if latest is None:
        previous = Period.of(now).previous()
        return [previous] if previous.end + BILL_AFTER <= now else []
    due: list[Period] = []
    period = latest.next()
    while period.end + BILL_AFTER <= now:
        due.append(period)
        period = period.next()
    return due


def bill_due_periods(*, now: datetime) -> list[str]:
    """Bill every due month in order; ids of the runs this call made. A refused month stops the
    catch-up (the next would be out of order) and raises, so the failure shows on the worker."""
    latest = BillingRun.objects.order_by("-period").values_list("period", flat=True).first()
    made: list[str] = []
    for period in periods_due(latest=Period.of(latest) if latest else None, now=now):
        try:
            run, created = billing_run_create(period=period, actor="system:beat")
        except BillingError as exc:
            log.error("billing run for %s refused: %s (%s); later months wait for it", period, exc.message, exc.code)
            raise
        log.info("billing run for %s: %s (%s invoices)", period, "created" if created else "already existed",
                 run.summary.get("invoices"))
        if created:
            made.append(str(run.pk))
    return made


@shared_task(name="metering.bill_due_periods")
def bill_due_periods_task() -> list[str]:
    """Beat's hourly tick; a second delivery finds the runs made and changes nothing."""
    return bill_due_periods(now=timezone.now())
