"""Billing pages: what finance (operator) and a customer each see and may do."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission
from django.test import Client

pytestmark = pytest.mark.django_db


@pytest.fixture
def people(billed, operator_org, make_member, settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # argon2 is slow on purpose
    acme = billed["acme"].organization
    clients = {}
    for name, org, email, role in (("finance", operator_org, "fin@dyno.test", "finance"),
                                   ("owner", acme, "owner@acme.test", "owner"),
                                   ("acme_finance", acme, "money@acme.test", "finance"),
                                   ("auditor", acme, "audit@acme.test", "auditor")):
        client = Client()
        client.force_login(make_member(org, email, role))
        clients[name] = client
    return clients


def test_it_shows_a_customer_only_its_own_finalized_invoices_and_savings(people, billed):
    from metering.invoices import invoice_finalize

    owner = people["owner"]
    assert owner.get(f"/billing/invoices/{billed['acme'].pk}").status_code == 404  # a draft is finance's
    for invoice in billed.values():
        invoice_finalize(invoice=invoice, actor="system:test")
    listing = owner.get("/billing/").content.decode()
    assert str(billed["acme"].pk) in listing and str(billed["beta"].pk) not in listing
    assert owner.get(f"/billing/invoices/{billed['beta'].pk}").status_code == 404
    assert owner.get(f"/billing/invoices/{billed['beta'].pk}/export.csv").status_code == 404
    page = owner.get(f"/billing/invoices/{billed['acme'].pk}").content.decode()
    assert "32.50 EUR" in page and 'id="finalize"' not in page
    savings = owner.get("/billing/savings").content.decode()
    assert 'id="savings-by-month-data"' in savings and "/reports/assets/plotly-" in savings
    assert people["acme_finance"].get(f"/billing/invoices/{billed['acme'].pk}").status_code == 200
    assert people["auditor"].get(f"/billing/invoices/{billed['acme'].pk}").status_code == 404
    assert owner.get("/billing/runs").status_code == 403
    assert owner.get("/billing/revenue").status_code == 403
    assert owner.post(f"/billing/invoices/{billed['acme'].pk}/finalize").status_code == 403


def test_it_lets_finance_run_billing_finalize_and_credit_from_the_pages(people, billed):
    finance = people["finance"]
    assert finance.post("/billing/runs", {"period": "2025-02"}).status_code == 302
    assert "2025-02" in finance.get("/billing/runs").content.decode()
    invoice = billed["acme"]
    finance.post(f"/billing/invoices/{invoice.pk}/finalize")
    invoice.refresh_from_db()
    assert invoice.status == "finalized"
    line = invoice.lines.get(position=1)
    finance.post(f"/billing/invoices/{invoice.pk}/credit-notes", {"reason_code": "goodwill", f"line-{line.pk}": "1.25"})
    assert invoice.credit_notes.get().total == 1.25
    revenue = finance.get("/billing/revenue").content.decode()
    assert 'id="revenue-by-month-data"' in revenue and "31.25" in revenue
    csv = finance.get("/billing/revenue-share.csv", {"period": "2025-01"})
    assert csv.status_code == 200 and b"acme" in csv.content
    assert "beta" in finance.get("/billing/", {"organization": "beta"}).content.decode()


def test_it_treats_staff_with_the_billing_permission_as_finance(billed, django_user_model, billing_settings):
    staff = django_user_model.objects.create_user("ops@dyno.test", "ops@dyno.test", "a-long-password-1",
                                                  is_staff=True)
    client = Client()
    client.force_login(staff)
    assert client.get("/billing/runs").status_code == 403
    staff.user_permissions.add(Permission.objects.get(codename="bill_customers"))
    client.force_login(django_user_model.objects.get(pk=staff.pk))
    assert client.get("/billing/runs").status_code == 200
    assert str(billed["beta"].pk) in client.get("/billing/").content.decode()


def test_it_renders_runs_contracts_and_deployments_and_adds_a_contract_version(people, billed):
    from datetime import timedelta

    from django.utils import timezone

    from metering.models import Contract

    finance, owner = people["finance"], people["owner"]
    run_page = finance.get(f"/billing/runs/{billed['acme'].run_id}").content.decode()
    assert "32.50 EUR" in run_page and "10.00 EUR" in run_page
    later = (timezone.now().date().replace(day=1) + timedelta(days=32)).replace(day=1)
    response = finance.post("/billing/contracts", {
        "organization": "acme", "effective_from": later.isoformat(), "revenue_share": "0.25",
        "prices": "gpu-h100=3.00, gpu-h200=5.00", "minimum_speedup": "1.05", "currency": "EUR",
        "rounding": "half_up", "dispute_window_days": "14", "suite_version": "v1", "baseline": "eager"})
    assert response.status_code == 302
    version = Contract.objects.get(organization__slug="acme", version=2)
    assert version.prices == {"gpu-h100": "3.00", "gpu-h200": "5.00"} and version.rounding == "half_up"
    refused = finance.post("/billing/contracts", {"organization": "acme", "effective_from": later.isoformat(),
                                                  "revenue_share": "2", "prices": "gpu-h100=1",
                                                  "minimum_speedup": "1", "suite_version": "v1", "baseline": "b"},
                           follow=True)
    assert "a fraction between 0 and 1" in refused.content.decode()
    mine = owner.get("/billing/contracts").content.decode()
    assert "acme" in mine and "beta" not in mine and 'id="contract-form"' not in mine
    assert owner.post("/billing/contracts", {"organization": "acme"}).status_code == 403
    deployments = owner.get("/billing/deployments").content.decode()
    assert "<td>acme</td>" in deployments and "<td>beta</td>" not in deployments


def test_finance_voids_and_reissues_from_the_invoice_page(people, billed):
    from metering.invoices import invoice_finalize
    from metering.models import Invoice

    finance, invoice = people["finance"], invoice_finalize(invoice=billed["acme"], actor="system:test")
    page = finance.get(f"/billing/invoices/{invoice.pk}").content.decode()
    assert "Void and reissue now" in page
    assert people["owner"].post(f"/billing/invoices/{invoice.pk}/reissue", {"reason": "x"}).status_code == 403
    response = finance.post(f"/billing/invoices/{invoice.pk}/reissue", {"reason": "wrong entity"}, follow=True)
    corrective = Invoice.objects.exclude(pk=invoice.pk).get(organization=invoice.organization, status="finalized")
    assert f"its usage is billed on {corrective.number}" in response.content.decode()
    assert corrective.total == invoice.total and Invoice.objects.get(pk=invoice.pk).status == "void"
    again = finance.post(f"/billing/invoices/{invoice.pk}/reissue", follow=True).content.decode()
    assert "billed again on invoice" in again  # the void invoice's page says where its usage went
