"""The monthly beat task bills the month that ended, once; the OpenAPI part describes every
metering endpoint the URLs route."""

from __future__ import annotations

import pytest
from django.urls import get_resolver

pytestmark = pytest.mark.django_db


def test_it_bills_the_previous_month_once_from_the_beat_task(billing_settings):
    from django.utils import timezone

    from metering.models import BillingRun
    from metering.periods import Period
    from metering.tasks import bill_previous_month

    first = bill_previous_month()
    again = bill_previous_month()
    assert first == again
    assert BillingRun.objects.get().period == Period.of(timezone.now()).previous().first_day


def test_it_documents_every_metering_api_path():
    from metering.openapi import metering_paths, metering_schemas

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
