"""Billing catches up: each beat tick bills every closed month that is due and unbilled, oldest
first, so a month missed while the control worker was down is billed by the next tick, and the
month after it is not refused as previous_period_unbilled."""

from __future__ import annotations

import pytest

from metering.periods import Period

from .conftest import at

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(("latest", "now", "due"), [
    (None, "2025-02-03 02:59", []),
    (None, "2025-02-03 03:00", ["2025-01"]),
    (None, "2025-06-20 00:00", ["2025-05"]),  # the first run takes all earlier usage
    ("2025-01", "2025-02-28 00:00", []),
    ("2025-01", "2025-03-03 03:00", ["2025-02"]),
    ("2025-01", "2025-05-02 12:00", ["2025-02", "2025-03"]),
    ("2025-01", "2025-05-03 04:00", ["2025-02", "2025-03", "2025-04"]),
    ("2024-11", "2025-02-03 03:00", ["2024-12", "2025-01"]),
    ("2025-04", "2025-05-03 04:00", []),
])
def test_it_knows_which_months_are_due(latest, now, due):
    from metering.tasks import periods_due

    assert [p.name for p in periods_due(latest=Period.parse(latest) if latest else None, now=at(now))] == due


def test_a_tick_after_an_outage_bills_every_missed_month_in_order(billed, ingest):
    from metering.models import BillingRun, Invoice
    from metering.tasks import bill_due_periods

    prod = billed["acme"].lines.exclude(record=None).first().record.deployment
    ingest(prod, [("2025-02-10 00:00", "10")])
    # January is billed; the worker was down on the 3rd of March and of April.
    made = bill_due_periods(now=at("2025-04-10 12:00"))
    runs = list(BillingRun.objects.order_by("period"))
    assert [Period.of(r.period).name for r in runs] == ["2025-01", "2025-02", "2025-03"]
    assert made == [str(runs[1].pk), str(runs[2].pk)]
    assert runs[2].previous_id == runs[1].pk and runs[1].previous_id == runs[0].pk
    assert Invoice.objects.filter(run=runs[1], organization__slug="acme").exists()  # February's usage billed
    assert bill_due_periods(now=at("2025-04-10 13:00")) == []  # the next tick finds nothing due


def test_a_refused_month_stops_the_catch_up_and_says_so(billed, monkeypatch, caplog):
    from metering import tasks
    from metering.errors import BillingError
    from metering.models import BillingRun

    bill = tasks.billing_run_create

    def refuse_march(*, period, actor):
        if period == Period(2025, 3):
            raise BillingError("period_not_over", "not yet")
        return bill(period=period, actor=actor)

    monkeypatch.setattr(tasks, "billing_run_create", refuse_march)
    with pytest.raises(BillingError):
        tasks.bill_due_periods(now=at("2025-05-10 00:00"))
    assert [Period.of(r.period).name for r in BillingRun.objects.order_by("period")] == ["2025-01", "2025-02"]
    assert "billing run for 2025-03 refused: not yet (period_not_over); later months wait" in caplog.text


def test_beat_ticks_hourly_on_the_control_queue(settings):
    entry = settings.CELERY_BEAT_SCHEDULE["metering-bill-due-periods"]
    assert entry["task"] == "metering.bill_due_periods" and entry["options"]["queue"] == "control"
    assert entry["schedule"].minute == {0} and len(entry["schedule"].hour) == 24
