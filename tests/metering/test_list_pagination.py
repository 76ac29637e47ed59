"""The metering and report lists page by cursor like every API list (api/pagination.py): newest
first, `limit`, `cursor`, `next`; filters and organization scoping hold on every page."""

from __future__ import annotations

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db


def _walk(key: str, path: str, list_key: str, **params) -> list[list[dict]]:
    client, pages, cursor = Client(), [], None
    while True:
        query = {**params, "limit": 1, **({"cursor": cursor} if cursor else {})}
        response = client.get(f"/api/v1/{path}", query, HTTP_AUTHORIZATION=f"Bearer {key}")
        assert response.status_code == 200, response.content
        pages.append(response.json()[list_key])
        cursor = response.json()["next"]
        if cursor is None:
            return pages
        assert len(pages) < 20, "the cursor does not move"


@pytest.fixture
def keys(billed, operator_org, make_key):
    acme = billed["acme"].organization
    return {"finance": make_key(operator_org, "finance"), "acme": make_key(acme, "customer")}


def _ids(pages: list[list[dict]]) -> list[str]:
    assert all(len(page) == 1 for page in pages)
    return [page[0]["id"] for page in pages]


def test_finance_pages_through_invoices_contracts_and_billing_runs(keys, billed):
    invoices = _walk(keys["finance"], "invoices", "invoices", status="draft", period="2025-01")
    assert sorted(_ids(invoices)) == sorted(str(i.pk) for i in billed.values())
    assert {page[0]["status"] for page in invoices} == {"draft"}  # the filter holds on every page
    assert len(_ids(_walk(keys["finance"], "contracts", "contracts"))) == 2
    assert len(_ids(_walk(keys["finance"], "billing-runs", "billing_runs"))) == 1


def test_a_customer_pages_through_its_own_deployments_and_reports_only(keys, billed):
    deployments = _walk(keys["acme"], "deployments", "deployments")
    assert len(_ids(deployments)) == 2 and {p[0]["organization"] for p in deployments} == {"acme"}
    reports = _walk(keys["acme"], "reports", "reports")
    assert len(_ids(reports)) == 2 and {p[0]["organization"] for p in reports} == {"acme"}


def test_credit_notes_page_newest_first(keys, billed):
    from metering.invoices import credit_note_issue, invoice_finalize

    invoice = invoice_finalize(invoice=billed["acme"], actor="system:test")
    line = invoice.lines.exclude(record=None).first()
    notes = [credit_note_issue(invoice=invoice, actor="system:test", reason_code="goodwill", amounts={line.pk: "1.00"})
             for _ in range(2)]
    pages = _walk(keys["finance"], f"invoices/{invoice.pk}/credit-notes", "credit_notes")
    assert _ids(pages) == [str(notes[1].pk), str(notes[0].pk)]


def test_it_refuses_a_cursor_of_another_shape(keys):
    response = Client().get("/api/v1/invoices", {"cursor": "not-a-cursor"},
                            HTTP_AUTHORIZATION=f"Bearer {keys['finance']}")
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_cursor"
