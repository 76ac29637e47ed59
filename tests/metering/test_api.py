"""The metering API: finance (the operator's finance keys) bills every organization; a customer's
keys see and write only their own deployments, usage and invoices (404 or rejected otherwise)."""

from __future__ import annotations

import csv
import io
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

pytestmark = pytest.mark.django_db


class Api:
    def __init__(self, key: str) -> None:
        self.client, self.key = Client(), key

    def get(self, path: str, **params):
        return self.client.get(f"/api/v1/{path}", params, HTTP_AUTHORIZATION=f"Bearer {self.key}")

    def post(self, path: str, body: dict | None = None):
        return self.client.post(f"/api/v1/{path}", body or {}, content_type="application/json",
                                HTTP_AUTHORIZATION=f"Bearer {self.key}")


@pytest.fixture
def keys(billed, operator_org, make_key):
    acme, beta = billed["acme"].organization, billed["beta"].organization
    return {"finance": Api(make_key(operator_org, "finance")), "acme": Api(make_key(acme, "customer")),
            "acme_finance": Api(make_key(acme, "finance")), "beta": Api(make_key(beta, "customer")),
            "operator_customer": Api(make_key(operator_org, "customer"))}


def test_it_lets_operator_finance_bill_finalize_credit_and_export(keys, billed):
    finance = keys["finance"]
    assert finance.post("billing-runs", {"period": "2025-01"}).json()["created"] is False  # billed by the fixture
    listed = finance.get("invoices", status="draft", period="2025-01").json()["invoices"]
    assert sorted((i["organization"], i["total"]) for i in listed) == [("acme", "32.50"), ("beta", "10.00")]
    acme_id = billed["acme"].pk
    done = finance.post(f"invoices/{acme_id}/finalize").json()
    assert done["status"] == "finalized" and done["number"].startswith("INV-")
    assert finance.post(f"invoices/{acme_id}/finalize").json()["error"]["code"] == "invalid_transition"
    line = done["lines"][1]
    assert line["billing_record"]["report_sha256"] and line["fee"] == "20.00"
    note = finance.post(f"invoices/{acme_id}/credit-notes", {"reason_code": "goodwill", "lines": {line["id"]: "2.50"}})
    assert note.status_code == 201 and note.json()["total"] == "2.50"
    assert finance.get(f"invoices/{acme_id}").json()["balance"] == "30.00"
    exported = finance.get(f"invoices/{acme_id}/export", format="csv")
    assert exported["Content-Type"].startswith("text/csv")
    assert list(csv.DictReader(io.StringIO(exported.content.decode())))[-1]["credited"] == "2.50"
    assert finance.get(f"invoices/{acme_id}/export", format="pdf").content.startswith(b"%PDF")
    assert finance.get(f"invoices/{acme_id}/export", format="xlsx").content[:2] == b"PK"
    summary = finance.get("exports/revenue-share", period="2025-01", format="csv").content.decode()
    assert "acme" in summary and "beta" not in summary  # beta's invoice is a draft: not revenue yet
    void = finance.post(f"invoices/{billed['beta'].pk}/void", {"reason": "x"})
    assert void.json()["error"]["code"] == "invalid_transition"  # still a draft


def test_it_creates_contract_versions_for_finance_only(keys, operator_org):
    from tests.metering.conftest import TERMS

    later = (timezone.now().date().replace(day=1) + timedelta(days=32)).replace(day=1)
    body = {**TERMS, "organization": "acme", "effective_from": later.isoformat(), "revenue_share": "0.30"}
    assert keys["acme_finance"].post("contracts", body).status_code == 403
    assert keys["operator_customer"].post("contracts", body).status_code == 403
    created = keys["finance"].post("contracts", body)
    assert created.status_code == 201 and created.json()["version"] == 2
    assert keys["finance"].post("contracts", {**body, "revenue_share": 0.3}).json()["error"]["code"] == "invalid_field"
    own = keys["acme"].get("contracts").json()["contracts"]
    assert {c["organization"] for c in own} == {"acme"} and len(own) == 2


def test_it_refuses_prices_and_caps_past_what_an_invoice_holds(keys, operator_org):
    # A price of 1E+20 a GPU-hour was stored, then overflowed the month's billing run for every
    # organization; a cap of 1E+20 failed the request itself (a red team, 2026-12-06).
    from metering.models import Contract
    from tests.metering.conftest import TERMS

    later = (timezone.now().date().replace(day=1) + timedelta(days=32)).replace(day=1)
    body = {**TERMS, "organization": "acme", "effective_from": later.isoformat()}
    stored = Contract.objects.count()
    hardware = next(iter(TERMS["prices"]))
    for change, says in (({"prices": {hardware: "1E+20"}}, "at most 1,000,000"),
                         ({"prices": {hardware: "1000000.000001"}}, "at most 1,000,000"),
                         ({"monthly_cap": "1E+20"}, "at most 1,000,000,000,000")):
        answer = keys["finance"].post("contracts", {**body, **change})
        assert answer.status_code == 400, answer.content
        assert answer.json()["error"]["code"] == "invalid_field" and says in answer.json()["error"]["message"]
    assert Contract.objects.count() == stored
    assert keys["finance"].post("contracts", {**body, "prices": {hardware: "1000000"}}).status_code == 201


def test_a_contracts_measurement_plan_pins_the_shape_billed_or_says_what_is_wrong(keys, operator_org):
    from metering.models import Contract
    from runs.shapes import MAX_SEQ
    from tests.metering.conftest import TERMS

    later = (timezone.now().date().replace(day=1) + timedelta(days=32)).replace(day=1)
    plan = TERMS["measurement_plan"]
    body = {**TERMS, "organization": "acme", "effective_from": later.isoformat()}
    stored = Contract.objects.count()
    for shape, says in (({"batch": 2}, "batch and seq together"), ({"batch": 2, "seq": "64.5"}, "whole number"),
                        ({"batch": True, "seq": 64}, "whole number"), ({"batch": 0, "seq": 64}, "batch 1 to 64"),
                        ({"batch": 2, "seq": MAX_SEQ + 1}, "seq 1 to 8192")):
        answer = keys["finance"].post("contracts", {**body, "measurement_plan": {**plan, **shape}})
        assert answer.status_code == 400, (shape, answer.content)
        assert answer.json()["error"]["code"] == "invalid_field" and says in answer.json()["error"]["message"], shape
    assert Contract.objects.count() == stored
    created = keys["finance"].post("contracts", {**body, "measurement_plan": {**plan, "batch": 2, "seq": 64}})
    assert created.status_code == 201, created.content
    assert created.json()["measurement_plan"]["batch"] == 2 and created.json()["measurement_plan"]["seq"] == 64
    listed = {c["version"]: c["measurement_plan"] for c in keys["acme"].get("contracts").json()["contracts"]}
    assert listed[1]["batch"] is None and listed[2]["seq"] == 64


def test_it_keeps_each_customer_inside_its_own_organization(keys, billed, make_report):
    from metering.invoices import invoice_finalize
    from metering.models import Deployment, UsageEvent

    acme, beta = keys["acme"], keys["beta"]
    assert acme.get(f"invoices/{billed['acme'].pk}").status_code == 404  # drafts are finance's work
    for invoice in billed.values():
        invoice_finalize(invoice=invoice, actor="system:test")
    beta_deployment = Deployment.objects.get(organization__slug="beta")
    beta_invoice = billed["beta"]
    assert {d["organization"] for d in acme.get("deployments").json()["deployments"]} == {"acme"}
    assert acme.get(f"deployments/{beta_deployment.pk}").status_code == 404
    assert acme.get(f"invoices/{beta_invoice.pk}").status_code == 404
    assert acme.get(f"invoices/{beta_invoice.pk}/export", format="csv").status_code == 404
    assert acme.get(f"invoices/{beta_invoice.pk}/credit-notes").status_code == 404
    assert {i["organization"] for i in acme.get("invoices").json()["invoices"]} == {"acme"}
    assert acme.get("invoices", organization="beta").json()["invoices"] == []
    assert keys["acme_finance"].get(f"invoices/{beta_invoice.pk}").status_code == 404
    sent = acme.post("usage/batch", {"events": [{"idempotency_key": "x", "deployment": str(beta_deployment.pk),
                                                  "timestamp": timezone.now().isoformat(), "gpu_hours": "1"}]})
    assert sent.json()["results"][0]["reason"]["code"] == "deployment_not_found"
    assert not UsageEvent.objects.filter(idempotency_key="x").exists()
    beta_report = make_report(beta_deployment.organization)
    assert acme.post("deployments", {"report": str(beta_report.pk), "name": "stolen"}).status_code == 404
    assert acme.post(f"deployments/{beta_deployment.pk}/reports", {"report": str(beta_report.pk)}).status_code == 404
    # A customer (even its finance key) neither bills nor finalizes.
    assert keys["acme_finance"].post("billing-runs", {"period": "2025-02"}).status_code == 403
    assert keys["acme_finance"].post(f"invoices/{billed['acme'].pk}/finalize").status_code == 403
    assert acme.post(f"invoices/{billed['acme'].pk}/finalize").status_code == 403
    assert acme.get("exports/revenue-share", period="2025-01").status_code == 403


def test_it_deploys_and_switches_reports_through_the_api(keys, make_report, make_contract):
    from metering.models import Deployment

    acme_org = Deployment.objects.get(name="prod", organization__slug="acme").organization
    report = make_report(acme_org, ci_low="1.3")
    created = keys["acme"].post("deployments", {"report": str(report.pk), "name": "eu-west"})
    assert created.status_code == 201, created.json()
    deployment = created.json()
    assert deployment["hardware"] == "gpu-h100" and deployment["reports"][0]["ci_low"] == "1.300000"
    assert keys["acme"].post("deployments", {"report": str(report.pk), "name": "eu-west"}).status_code == 409
    reaudit = make_report(acme_org, ci_low="1.2", supersedes=report)
    # The customer never picks the report it is billed under; the operator's finance corrects by hand, saying why.
    picked = keys["acme"].post(f"deployments/{deployment['id']}/reports", {"report": str(reaudit.pk), "reason": "cheaper"})
    assert picked.status_code == 403, picked.json()
    unexplained = keys["finance"].post(f"deployments/{deployment['id']}/reports", {"report": str(reaudit.pk)})
    assert unexplained.status_code == 400 and "reason" in unexplained.json()["error"]["message"]
    switched = keys["finance"].post(f"deployments/{deployment['id']}/reports",
                                    {"report": str(reaudit.pk), "reason": "re-audit stored before the hook existed"})
    assert switched.status_code == 201, switched.json()
    assert [r["report"] for r in switched.json()["reports"]] == [str(report.pk), str(reaudit.pk)]
    other_artifact = make_report(acme_org, ci_low="1.05", version=reaudit.run.model_version)
    moved = keys["finance"].post(f"deployments/{deployment['id']}/reports", {"report": str(other_artifact.pk), "reason": "x"})
    assert moved.json()["error"]["code"] == "report_artifact_mismatch"
    unstable = make_report(acme_org, ci_low="1.5", stable=False)
    refused_unstable = keys["acme"].post("deployments", {"report": str(unstable.pk), "name": "shaky"})
    assert refused_unstable.status_code == 409 and refused_unstable.json()["error"]["code"] == "report_unstable"
    assert "stable report" in refused_unstable.json()["error"]["message"]
    stale = keys["acme"].post("deployments", {"report": str(report.pk), "name": "stale"})
    assert stale.json()["error"]["code"] == "report_superseded"
    other_suite = make_report(acme_org, suite_version="v0")
    refused = keys["acme"].post("deployments", {"report": str(other_suite.pk), "name": "old-suite"})
    assert refused.json()["error"]["code"] == "measurement_plan_mismatch"


def test_it_refuses_an_out_of_order_or_unfinished_period(keys):
    finance = keys["finance"]
    assert finance.post("billing-runs", {"period": "2025-03"}).json()["error"]["code"] == "previous_period_unbilled"
    assert finance.post("billing-runs", {"period": "2024-12"}).json()["error"]["code"] == "period_out_of_order"
    assert finance.post("billing-runs", {"period": "25-1"}).json()["error"]["code"] == "invalid_period"
    feb = finance.post("billing-runs", {"period": "2025-02"})
    assert feb.status_code == 201 and feb.json()["summary"]["invoices"] == 0


def test_finance_voids_and_reissues_over_the_api_and_the_customer_may_not(keys, billed):
    from metering.models import Invoice

    finance, acme_id = keys["finance"], billed["acme"].pk
    finance.post(f"invoices/{acme_id}/finalize")
    assert keys["acme"].post(f"invoices/{acme_id}/reissue", {"reason": "x"}).status_code == 403
    assert finance.post(f"invoices/{acme_id}/reissue", {}).json()["error"]["code"] == "missing_field"  # no reason
    corrective = finance.post(f"invoices/{acme_id}/reissue", {"reason": "wrong billing address"})
    assert corrective.status_code == 201, corrective.json()
    body = corrective.json()
    assert body["status"] == "finalized" and body["total"] == "32.50" and body["id"] != str(acme_id)
    assert Invoice.objects.get(pk=acme_id).status == "void"
    again = finance.post(f"invoices/{acme_id}/reissue", {})
    assert again.status_code == 409 and again.json()["error"]["code"] == "already_reissued"
    assert finance.post(f"invoices/{billed['beta'].pk}/reissue", {"reason": "x"}).status_code == 409  # a draft
