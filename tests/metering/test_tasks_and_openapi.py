"""The beat task bills the month that ended, once (catch-up: tests/metering/test_billing_catch_up.py);
the generated OpenAPI document describes every metering endpoint the router routes."""

from __future__ import annotations

import json
import re

import pytest

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
    from api.app import api
    from metering import api as metering_api

    document = json.loads(json.dumps(api.get_openapi_schema()))  # as served: statuses are strings
    routed = {re.sub(r"{[^}:]+:", "{", path) for path in metering_api.router.path_operations}
    assert routed == METERING_PATHS
    assert METERING_PATHS <= set(document["paths"])
    # Every reference resolves, whatever part of the API made it.
    schemas = document["components"]["schemas"]
    referenced = {ref.split("/")[-1] for ref in _refs(document)}
    assert referenced and referenced <= set(schemas), referenced - set(schemas)
    # Each operation names the answers it gives, its errors as Error and its downloads as files.
    for path in METERING_PATHS:
        for method, operation in document["paths"][path].items():
            responses = operation["responses"]
            assert {"401", "403"} <= set(responses), (method, path)
            ok = [status for status in responses if status.startswith("2")]
            assert ok and operation["summary"], (method, path)
            for status, answer in responses.items():
                types = set(answer["content"])
                if status.startswith("2") and path.endswith(("/export", "/revenue-share")):
                    assert "application/json" not in types and "text/csv" in types, (method, path)
                elif not status.startswith("2"):
                    assert answer["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Error"}
                else:
                    assert types == {"application/json"}, (method, path)


METERING_PATHS = {
    "/contracts", "/contracts/{contract_id}", "/deployments", "/deployments/{deployment_id}",
    "/deployments/{deployment_id}/reports", "/usage/batch", "/billing-runs", "/billing-runs/{run_id}", "/invoices",
    "/invoices/{invoice_id}", "/invoices/{invoice_id}/finalize", "/invoices/{invoice_id}/void",
    "/invoices/{invoice_id}/reissue", "/invoices/{invoice_id}/credit-notes", "/invoices/{invoice_id}/export",
    "/exports/revenue-share", "/invoices/preview",
}


def _refs(node) -> set[str]:
    if isinstance(node, dict):
        found = {node["$ref"]} if "$ref" in node else set()
        return found.union(*(_refs(value) for value in node.values()))
    if isinstance(node, list):
        return set().union(*(_refs(value) for value in node))
    return set()
