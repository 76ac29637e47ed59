"""The upcoming-invoice preview: a hand computation to the cent, the same lines the billing run then
stores, nothing written, each customer inside its own organization, finance across all of them.

Contract of acme from 2025-01: share 0.20, gpu-h100 at 2.50 EUR/GPU-hour, gpu-h200 at 4.00,
minimum speedup 1.05, rounding half-even, no cap. Contract of beta: the same, half-up, monthly cap
10.00 EUR.

March 2025 previewed on the 20th, acme (lines in deployment-name order, then by segment):
  api   (h100) under report A (CI low 1.3333) until 2025-03-10, then re-audit B (CI low 1.2):
        A: 12.5 + 30.25 = 42.75 h; saved = 42.75 x 0.3333 = 14.248575 h
           savings = 14.248575 x 2.50 = 35.6214375 -> 35.62; fee = 0.20 x 35.6214375 = 7.1242875 -> 7.12
        B: 20 h; saved = 20 x 0.2 = 4 h; savings 10.00; fee 2.00
  batch (h200, CI low 1.0625): 8 h; saved 0.5 h; savings 0.5 x 4.00 = 2.00; fee 0.40
  tiny  (h100, CI low 1.05, exactly the minimum): 3 h; saved 0.15 h
        savings 0.375 -> half-even 0.38 (7 is odd, so the tie goes up); fee 0.075 -> 0.08
  total = 7.12 + 2.00 + 0.40 + 0.08 = 9.60
March 2025, beta (half-up, cap 10.00):
  main  (CI low 1.5): 90 h; saved 45 h; savings 112.50; fee 22.50
  side  (CI low 1.04 < 1.05): 10 h -> speedup billed as 1, fee 0.00, below_minimum
  22.50 > 10.00 -> cap line -12.50; total 10.00

April 2025 previewed on the 15th, after March's run:
  acme  api under B: 10 h; saved 2 h; savings 5.00; fee 1.00
        tiny, late March usage (received after March's run): 2 h; saved 0.1 h; savings 0.25; fee 0.05
        (an adjustment line); total 1.05
  beta  main, late March usage: 4 h; saved 2 h; savings 5.00; fee 1.00, but March already billed its
        cap of 10.00, so the cap left is 0.00: adjustment 1.00 and cap line -1.00; total 0.00
"""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.apps import apps
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from tests.metering.conftest import at

D = Decimal
pytestmark = pytest.mark.django_db

MARCH_20 = at("2025-03-20 12:00")
APRIL_15 = at("2025-04-15 12:00")


@pytest.fixture
def world(make_org, make_report, make_contract, make_deployment, ingest, billing_settings):
    from metering.deployments import deployment_switch_report

    acme, beta = make_org("acme"), make_org("beta")
    make_contract(acme)
    make_contract(beta, rounding="half_up", monthly_cap="10.00")
    report_a = make_report(acme, ci_low="1.3333")
    api = make_deployment(acme, report_a, name="api")
    report_b = make_report(acme, ci_low="1.2", supersedes=report_a)
    deployment_switch_report(actor="system:test", deployment=api, report=report_b,
                             effective_from=at("2025-03-10 00:00"))
    batch = make_deployment(acme, make_report(acme, hardware="gpu-h200", ci_low="1.0625"), name="batch")
    tiny = make_deployment(acme, make_report(acme, ci_low="1.05"), name="tiny")
    main = make_deployment(beta, make_report(beta, ci_low="1.5"), name="main")
    side = make_deployment(beta, make_report(beta, ci_low="1.04"), name="side")
    ingest(api, [("2025-03-02 10:00", "12.5"), ("2025-03-05 10:00", "30.25"), ("2025-03-12 10:00", "20")])
    ingest(batch, [("2025-03-03 00:00", "8")])
    ingest(tiny, [("2025-03-04 00:00", "3")])
    ingest(main, [("2025-03-06 00:00", "90")])
    ingest(side, [("2025-03-07 00:00", "10")])
    return {"acme": acme, "beta": beta, "api": api, "tiny": tiny, "main": main, "report_a": report_a,
            "report_b": report_b}


def _late_march_and_april(world, ingest):
    ingest(world["tiny"], [("2025-03-31 12:00", "2")], now=at("2025-04-02 00:00"))
    ingest(world["main"], [("2025-03-31 12:00", "4")], now=at("2025-04-02 00:00"))
    ingest(world["api"], [("2025-04-03 00:00", "10")])


def _fees(invoice):
    return [(line.kind, line.fee, line.reason) for line in invoice.lines]


def test_it_previews_the_open_month_to_the_cent(world):
    from metering.preview import invoice_preview

    preview = invoice_preview(organization=world["acme"], now=MARCH_20)
    assert preview.period.name == "2025-03" and preview.previous_run is None and preview.unbilled == ()
    (acme,) = preview.invoices
    assert (acme.organization, acme.currency, acme.monthly_cap, acme.cap_applied) == ("acme", "EUR", None, D(0))
    assert _fees(acme) == [("usage", D("7.12"), ""), ("usage", D("2.00"), ""), ("usage", D("0.40"), ""),
                           ("usage", D("0.08"), "")]
    assert acme.total == D("9.60")
    api_a, api_b, batch, tiny = acme.lines
    assert (api_a.deployment, api_a.report_id, api_a.speedup, api_a.hours) == (
        "api", str(world["report_a"].pk), D("1.3333"), D("42.75"))
    assert (api_a.saved_hours, api_a.savings) == (D("14.248575"), D("35.62"))
    assert (api_b.report_id, api_b.speedup, api_b.hours, api_b.savings) == (
        str(world["report_b"].pk), D("1.2"), D("20"), D("10.00"))
    assert (batch.hardware, batch.price_per_hour, batch.saved_hours, batch.savings) == (
        "gpu-h200", D("4.00"), D("0.5"), D("2.00"))
    assert (tiny.saved_hours, tiny.savings, tiny.fee) == (D("0.15"), D("0.38"), D("0.08"))

    (beta,) = invoice_preview(organization=world["beta"], now=MARCH_20).invoices
    assert _fees(beta) == [("usage", D("22.50"), ""), ("usage", D("0.00"), "below_minimum"),
                           ("cap", D("-12.50"), "cap")]
    assert (beta.monthly_cap, beta.cap_applied, beta.total) == (D("10.00"), D("-12.50"), D("10.00"))
    assert beta.lines[1].speedup == D(1) and beta.lines[2].deployment_id is None

    data = preview.as_dict()
    assert data["period"] == "2025-03" and data["invoices"][0]["total"] == "9.60"
    line = data["invoices"][0]["lines"][0]
    assert (line["deployment_name"], line["speedup"], line["hours"], line["saved_hours"], line["fee"]) == (
        "api", "1.333300", "42.750000", "14.248575", "7.12")


def test_it_previews_what_the_billing_run_then_invoices(world, ingest):
    from metering.billing import billing_run_create
    from metering.models import Invoice
    from metering.periods import Period
    from metering.preview import invoice_preview

    def same(preview_invoice, invoice):
        stored = [(line.position, line.kind, Period.of(line.usage_period), line.description, line.hours, line.speedup,
                   line.saved_hours, line.price_per_hour, line.share, line.savings, line.fee, line.reason,
                   str(line.record.deployment_id) if line.record else None,
                   str(line.record.report_id) if line.record else None)
                  for line in invoice.lines.select_related("record").order_by("position")]
        shown = [(line.position, line.kind, line.usage_period, line.description, line.hours, line.speedup,
                  line.saved_hours, line.price_per_hour, line.share, line.savings, line.fee, line.reason,
                  line.deployment_id, line.report_id) for line in preview_invoice.lines]
        assert shown == stored
        assert (preview_invoice.currency, preview_invoice.total) == (invoice.currency, invoice.total)

    march = {org: invoice_preview(organization=world[org], now=MARCH_20) for org in ("acme", "beta")}
    run, _ = billing_run_create(period=Period(2025, 3), actor="system:test")
    for org, preview in march.items():
        (planned,) = preview.invoices
        same(planned, Invoice.objects.get(run=run, organization=world[org]))

    _late_march_and_april(world, ingest)
    april = {org: invoice_preview(organization=world[org], now=APRIL_15) for org in ("acme", "beta")}
    assert april["acme"].previous_run == Period(2025, 3)
    assert _fees(april["acme"].invoices[0]) == [("usage", D("1.00"), ""), ("adjustment", D("0.05"), "")]
    assert april["acme"].invoices[0].total == D("1.05")
    assert _fees(april["beta"].invoices[0]) == [("adjustment", D("1.00"), ""), ("cap", D("-1.00"), "cap")]
    assert april["beta"].invoices[0].total == D("0.00")
    run, _ = billing_run_create(period=Period(2025, 4), actor="system:test")
    for org, preview in april.items():
        same(preview.invoices[0], Invoice.objects.get(run=run, organization=world[org]))


def test_it_stores_nothing_and_consumes_no_invoice_number(world, ingest, operator_org):
    from metering.billing import billing_run_create
    from metering.invoices import invoice_finalize
    from metering.models import DocumentCounter, Invoice
    from metering.periods import Period
    from metering.preview import invoice_preview, invoice_preview_all
    from metering.selectors import BillingAccess

    run, _ = billing_run_create(period=Period(2025, 3), actor="system:test")
    first = invoice_finalize(invoice=Invoice.objects.get(run=run, organization=world["acme"]), actor="system:test")
    _late_march_and_april(world, ingest)
    models = [*apps.get_app_config("metering").get_models(), *apps.get_app_config("auditlog").get_models()]

    def snapshot():
        return ({model.__name__: model.objects.count() for model in models},
                list(DocumentCounter.objects.values_list("series", "year", "last")))

    before = snapshot()
    with CaptureQueriesContext(connection) as queries:
        invoice_preview(organization=world["acme"], now=APRIL_15)
        invoice_preview_all(access=BillingAccess(operator=True, org_ids=frozenset()), now=APRIL_15)
    assert snapshot() == before
    written = [q["sql"] for q in queries.captured_queries
               if not q["sql"].lstrip().upper().startswith(("SELECT", "WITH"))]
    assert written == []
    second = invoice_finalize(invoice=Invoice.objects.get(run=run, organization=world["beta"]), actor="system:test")
    assert int(second.number.rsplit("-", 1)[1]) == int(first.number.rsplit("-", 1)[1]) + 1


def test_it_refuses_to_preview_a_month_billed_already(world):
    from metering.billing import billing_run_create
    from metering.errors import BillingError
    from metering.periods import Period
    from metering.preview import invoice_preview, invoice_preview_all
    from metering.selectors import BillingAccess

    billing_run_create(period=Period(2025, 3), actor="system:test")
    with pytest.raises(BillingError) as billed:
        invoice_preview(organization=world["acme"], now=MARCH_20)
    assert billed.value.status == 409 and "/api/v1/invoices?period=2025-03" in billed.value.message
    with pytest.raises(BillingError) as refused:
        invoice_preview_all(access=BillingAccess(operator=False, org_ids=frozenset({world["acme"].pk})))
    assert refused.value.status == 403


# --- the API and the pages: usage in the month that is open now ----------------------------------


@pytest.fixture
def current(make_org, make_report, make_contract, make_deployment, ingest, billing_settings, operator_org, make_key):
    """Usage in this month, at its first instant: acme prod 200 h at CI low 1.2 -> saved 40 h,
    savings 100.00, fee 20.00; beta main 100 h at 1.5 -> fee 25.00, cap line -15.00, total 10.00."""
    from metering.periods import Period

    start = Period.of(timezone.now()).start.strftime("%Y-%m-%d %H:%M")
    acme, beta = make_org("acme"), make_org("beta")
    make_contract(acme)
    make_contract(beta, monthly_cap="10.00")
    ingest(make_deployment(acme, make_report(acme, ci_low="1.2"), name="prod"), [(start, "200")])
    ingest(make_deployment(beta, make_report(beta, ci_low="1.5"), name="main"), [(start, "100")])
    return {"acme": acme, "beta": beta, "operator": operator_org,
            "keys": {"finance": make_key(operator_org, "finance"), "acme": make_key(acme, "customer"),
                     "acme_finance": make_key(acme, "finance"), "beta": make_key(beta, "customer"),
                     "operator_customer": make_key(operator_org, "customer")}}


def _get(key: str, **params):
    return Client().get("/api/v1/invoices/preview", params, HTTP_AUTHORIZATION=f"Bearer {key}")


def test_it_shows_a_customer_key_only_its_own_organization(current):
    from metering.periods import Period

    keys = current["keys"]
    for name in ("acme", "acme_finance"):
        data = _get(keys[name]).json()
        assert data["period"] == Period.of(timezone.now()).name
        assert [(i["organization"], i["total"], i["cap_applied"]) for i in data["invoices"]] == [
            ("acme", "20.00", "0.00")]
        line = data["invoices"][0]["lines"][0]
        assert (line["deployment_name"], line["speedup"], line["hours"], line["fee"]) == (
            "prod", "1.200000", "200.000000", "20.00")
    assert _get(keys["acme"], organization="acme").status_code == 200
    other = _get(keys["acme"], organization="beta")
    assert other.status_code == 404
    assert other.json()["error"]["code"] == "not_found" and "your own" in other.json()["error"]["message"]
    beta = _get(keys["beta"]).json()["invoices"]
    assert [(i["organization"], i["total"], i["monthly_cap"]) for i in beta] == [("beta", "10.00", "10.00")]
    # A customer key of the operator's own organization is a customer like any other.
    assert _get(keys["operator_customer"]).json()["invoices"] == []
    assert Client().get("/api/v1/invoices/preview").status_code == 401


def test_it_shows_finance_every_organization(current):
    keys = current["keys"]
    data = _get(keys["finance"]).json()
    assert [(i["organization"], i["total"], i["cap_applied"]) for i in data["invoices"]] == [
        ("acme", "20.00", "0.00"), ("beta", "10.00", "-15.00")]
    assert [i["organization"] for i in _get(keys["finance"], organization="beta").json()["invoices"]] == ["beta"]
    assert _get(keys["finance"], organization="nobody").status_code == 404


def test_it_lists_the_preview_in_the_openapi_document(current):
    document = Client().get("/api/v1/openapi.json").json()
    operation = document["paths"]["/invoices/preview"]["get"]
    assert operation["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/InvoicePreview"}
    assert {"InvoicePreview", "PreviewLine"} <= set(document["components"]["schemas"])


def test_it_shows_the_preview_on_the_billing_pages(current, make_member, settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    owner, finance = Client(), Client()
    owner.force_login(make_member(current["acme"], "owner@acme.test", "owner"))
    finance.force_login(make_member(current["operator"], "fin@dyno.test", "finance"))

    page = owner.get("/billing/").content.decode()
    preview = page[page.index('id="invoice-preview"'):]
    assert "20.00 EUR" in preview and "prod on gpu-h100" in preview and "main on" not in preview
    runs = finance.get("/billing/runs").content.decode()
    preview = runs[runs.index('id="invoice-preview"'):]
    assert "<td>acme</td>" in preview and "20.00 EUR" in preview
    assert "<td>beta</td>" in preview and "10.00 EUR" in preview and "-15.00" in preview
    assert 'id="invoice-preview"' not in finance.get("/billing/").content.decode()
