"""The beat task bills the month that ended, once (catch-up: tests/metering/test_billing_catch_up.py);
the OpenAPI part describes every metering endpoint the URLs route."""

from __future__ import annotations

import pytest
from django.urls import get_resolver

pytestmark = pytest.mark.django_db


def test_it_bills_the_previous_month_once_from_the_beat_task(billing_settings, monkeypatch):
    from django.utils import timezone

    from metering import tasks
    from metering.models import BillingRun
    from metering.periods import Period

    due = Period.of(timezone.now()).start + tasks.BILL_AFTER  # this month's 3rd, 03:00: the previous one is due
    monkeypatch.setattr(timezone, "now", lambda: due)
    first = tasks.bill_due_periods_task()
    again = tasks.bill_due_periods_task()
    assert len(first) == 1 and again == []
    assert BillingRun.objects.get().period == Period.of(timezone.now()).previous().first_day


def test_it_documents_every_metering_api_path():
    from api.openapi_metering import metering_paths, metering_schemas

    documented = set(metering_paths())
    routed = set()
    for pattern in get_resolver().url_patterns:
        for inner in getattr(pattern, "url_patterns", []):
            route = str(inner.pattern)
            if getattr(inner, "name", "") and route.startswith("api/v1/") and "metering" in inner.callback.__module__:
                routed.add("/" + route.removeprefix("api/v1/").replace("<uuid:", "{").replace(">", "}"))
    assert routed and routed == documented
    schemas = metering_schemas()
    referenced = {ref.split("/")[-1] for ref in _refs(metering_paths()) | _refs(schemas)}
    assert referenced - {"Error"} <= set(schemas)


def _refs(node) -> set[str]:
    if isinstance(node, dict):
        found = {node["$ref"]} if "$ref" in node else set()
        return found.union(*(_refs(value) for value in node.values()))
    if isinstance(node, list):
        return set().union(*(_refs(value) for value in node))
    return set()
