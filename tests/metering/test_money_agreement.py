"""The three money views agree to the cent: the revenue-share export, the revenue dashboard and
the invoice list count finalized invoices only, net of credit notes.

January 2025, contract TERMS (share 0.20, h100 2.50, h200 4.00 EUR/GPU-hour), the `billed` fixture
plus two organizations:
  acme   32.50, finalized, credit note 1.25 on its h100 line       -> 31.25
  beta   10.00 (25.00 capped), finalized, then voided and reissued:
         the void one counts 0, the corrective one 10.00           -> 10.00
  gamma  h100 CI low 1.5, 40 h: saved 20 h x 2.50 = 50.00, fee 10.00, left a draft -> 0
  delta  h200 CI low 1.1, 30 h: saved 3 h x 4.00 = 12.00, fee 2.40, finalized     -> 2.40
  revenue of January: 31.25 + 10.00 + 2.40 = 43.65 EUR
"""

from __future__ import annotations

import csv
import io
from decimal import Decimal

import pytest
from django.test import Client

D = Decimal
pytestmark = pytest.mark.django_db
HAND_TOTAL = D("43.65")


@pytest.fixture
def january(make_org, make_report, make_contract, make_deployment, ingest, billing_settings):
    from metering.billing import billing_run_create
    from metering.invoices import credit_note_issue, invoice_finalize, invoice_reissue
    from metering.models import Invoice
    from metering.periods import Period

    acme, beta, gamma, delta = (make_org(slug) for slug in ("acme", "beta", "gamma", "delta"))
    for org in (acme, gamma, delta):
        make_contract(org)
    make_contract(beta, monthly_cap="10.00")
    ingest(make_deployment(acme, make_report(acme, ci_low="1.2"), name="prod"), [("2025-01-10 00:00", "200")])
    ingest(make_deployment(acme, make_report(acme, ci_low="1.25", hardware="gpu-h200"), name="big"),
           [("2025-01-11 00:00", "62.5")])
    ingest(make_deployment(beta, make_report(beta, ci_low="1.5"), name="main"), [("2025-01-12 00:00", "100")])
    ingest(make_deployment(gamma, make_report(gamma, ci_low="1.5"), name="g"), [("2025-01-13 00:00", "40")])
    ingest(make_deployment(delta, make_report(delta, ci_low="1.1", hardware="gpu-h200"), name="d"),
           [("2025-01-14 00:00", "30")])
    run, _ = billing_run_create(period=Period(2025, 1), actor="system:test")
    invoices = {i.organization.slug: i for i in Invoice.objects.filter(run=run).select_related("organization")}
    assert {slug: i.total for slug, i in invoices.items()} == {
        "acme": D("32.50"), "beta": D("10.00"), "gamma": D("10.00"), "delta": D("2.40")}
    acme_final = invoice_finalize(invoice=invoices["acme"], actor="system:test")
    credit_note_issue(invoice=acme_final, actor="system:test", reason_code="goodwill",
                      amounts={acme_final.lines.get(position=2).pk: "1.25"})
    invoice_reissue(invoice=invoice_finalize(invoice=invoices["beta"], actor="system:test"), actor="system:test",
                    reason="wrong legal entity")
    invoice_finalize(invoice=invoices["delta"], actor="system:test")
    return invoices


@pytest.fixture
def finance(operator_org, make_member, settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    client = Client()
    client.force_login(make_member(operator_org, "fin@dyno.test", "finance"))
    return client


def test_it_gives_the_same_revenue_in_the_export_the_dashboard_and_the_invoice_list(january, finance):
    from metering.exports import revenue_share_table
    from metering.models import Invoice
    from metering.periods import Period

    # The revenue-share export: its total row, as the table and as the CSV finance downloads.
    table = revenue_share_table(Period(2025, 1))
    totals = [dict(zip(table.columns, row)) for row in table.rows if row[0] == "total"]
    assert [(t["currency"], t["net"]) for t in totals] == [("EUR", HAND_TOTAL)]
    rows = list(csv.DictReader(io.StringIO(finance.get("/billing/revenue-share.csv", {"period": "2025-01"})
                                           .content.decode())))
    assert [r["net"] for r in rows if r["organization"] == "total"] == [str(HAND_TOTAL)]
    assert sum(D(r["net"]) for r in rows if r["organization"] != "total") == HAND_TOTAL
    assert {r["organization"] for r in rows} == {"acme", "beta", "delta", "total"}  # no draft, no void

    # The revenue dashboard: the month, the customers and the hardware classes each add up to it.
    dashboard = finance.get("/billing/revenue")
    month = [row for row in dashboard.context["month_table"] if row["period"] == "2025-01"]
    assert [(row["currency"], row["invoiced"], row["credited"], row["net"]) for row in month] == [
        ("EUR", D("44.90"), D("1.25"), HAND_TOTAL)]
    assert sum(row["net"] for row in dashboard.context["customer_table"]) == HAND_TOTAL
    assert sum(row["net"] for row in dashboard.context["hardware_table"]) == HAND_TOTAL
    assert "43.65" in dashboard.content.decode()

    # The invoice list: its revenue line, and its finalized rows' net column.
    listing = finance.get("/billing/", {"period": "2025-01"})
    assert [(row["currency"], row["net"]) for row in listing.context["revenue"]] == [("EUR", HAND_TOTAL)]
    shown = list(listing.context["invoices"])
    assert {i.status for i in shown} == {"draft", "finalized", "void"} and len(shown) == 5
    assert sum(i.net for i in shown if i.status == "finalized") == HAND_TOTAL
    assert "43.65 EUR" in listing.content.decode()
    assert Invoice.objects.filter(period="2025-01-01").count() == 5


def test_it_shows_a_customer_the_same_figure_for_its_own_invoices(january, make_member, settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    client = Client()
    client.force_login(make_member(january["acme"].organization, "owner@acme.test", "owner"))
    listing = client.get("/billing/")
    assert [(row["currency"], row["net"]) for row in listing.context["revenue"]] == [("EUR", D("31.25"))]
    assert {i.organization.slug for i in listing.context["invoices"]} == {"acme"}
