"""Fixtures for the metering tests: signed-report rows (fake bytes and signature are enough for
metering), contracts, deployments and usage in past months, and the billing settings."""

from __future__ import annotations

import hashlib
import json
import uuid
from datetime import UTC, date, datetime
from decimal import Decimal

import pytest

OPERATOR = "dyno-ops"
TERMS = {
    "revenue_share": "0.20", "prices": {"gpu-h100": "2.50", "gpu-h200": "4.00"}, "minimum_speedup": "1.05",
    "currency": "EUR", "rounding": "half_even", "dispute_window_days": 30,
    "measurement_plan": {"suite_version": "v1", "baseline": "eager PyTorch with the standard ops"},
}


def at(text: str) -> datetime:
    """'2025-03-04 10:00' as an aware UTC datetime."""
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


@pytest.fixture
def billing_settings(settings):
    # Tests bill right after ingesting, so no margin; the operator org makes finance platform-wide.
    settings.DYNO_BILLING_CUTOFF_MARGIN_SECONDS = 0
    settings.DYNO_BILLING_OPERATOR_ORG = OPERATOR
    return settings


@pytest.fixture
def make_version(db):
    from catalog.models import Model, ModelVersion

    def make(org, name: str = "llama"):
        model, _ = Model.objects.get_or_create(organization=org, name=name)
        number = model.versions.count() + 1
        return ModelVersion.objects.create(model=model, number=number, kind="weights", family="llama",
                                           architecture="LlamaForCausalLM", parameter_count=1000, dtype="float32",
                                           config={}, storage_dir=f"/nonexistent/{uuid.uuid4().hex}")

    return make


@pytest.fixture
def make_report(db, make_version):
    from reports.models import Report
    from runs.models import Run

    def make(org, *, hardware: str = "gpu-h100", ci_low: str = "1.25", stable: bool = True,
             suite_version: str = "v1", supersedes=None, version=None, artifact_sha256: str | None = None,
             reasons: tuple[str, ...] = (), shape: tuple[int, int] = (1, 32)):
        version = version or (supersedes.run.model_version if supersedes is not None else make_version(org))
        # A re-audit measures the same artifact again; any other report a fresh one.
        artifact = artifact_sha256 or (supersedes.run.artifact_sha256 if supersedes is not None
                                       else hashlib.sha256(uuid.uuid4().bytes).hexdigest())
        run = Run.objects.create(organization=org, model_version=version, hardware=hardware, status="succeeded",
                                 artifact_sha256=artifact, batch=shape[0], seq=shape[1])
        body = json.dumps({"schema": "dyno.report/1", "suite": {"version": suite_version, "profile": "gpu",
                                                                "manifest_sha256": "f" * 64},
                           "run": {"id": str(run.id)},
                           # The billing block as reports.document writes it; reconcile reads S from here.
                           "billing": {"basis": "ci95_low", "calibration_stable": stable,
                                       "reasons": [{"code": code, "message": code} for code in reasons],
                                       "model": {"ci95_low": ci_low}}},
                          sort_keys=True, separators=(",", ":")).encode()
        return Report.objects.create(
            organization=org, kind="reaudit" if supersedes is not None else "run", run=run, supersedes=supersedes,
            hardware=hardware, body=body, body_sha256=hashlib.sha256(body).hexdigest(), key_id="test-key-1",
            signature="c2lnbmF0dXJl" * 7, model_speedup=Decimal(ci_low) + Decimal("0.1"),
            model_ci_low=Decimal(ci_low), model_ci_high=Decimal(ci_low) + Decimal("0.2"), stable=stable)

    return make


@pytest.fixture
def make_contract(db):
    from metering.contracts import contract_terms_from, contract_version_create

    def make(org, effective_from: date = date(2025, 1, 1), **overrides):
        terms = contract_terms_from({**TERMS, **overrides})
        return contract_version_create(organization=org, terms=terms, effective_from=effective_from,
                                       actor="system:test", today=effective_from)

    return make


@pytest.fixture
def make_deployment(db):
    from accounts.selectors import Actor
    from metering.deployments import deployment_create

    def make(org, report, *, name: str | None = None, active_from: datetime = at("2025-01-01 00:00")):
        return deployment_create(actor=Actor(roles={org.pk: "owner"}), organization=org, report=report,
                                 name=name or f"dep-{uuid.uuid4().hex[:6]}", active_from=active_from)

    return make


def unchecked_deployment(org, report, *, name: str, active_from: datetime = at("2025-01-01 00:00")):
    """A deployment under an unstable report, written straight to the tables: the platform refuses
    to create one (report_unstable), but the fee engine must still bill such a row at S = 1 (rows
    from before that rule, or written by hand), so the billing tests keep that case."""
    from metering.models import Deployment, DeploymentReport

    deployment = Deployment.objects.create(organization=org, name=name, model_version_id=report.run.model_version_id,
                                           hardware=report.hardware, artifact_sha256=report.run.artifact_sha256,
                                           active_from=active_from, created_by="system:test")
    DeploymentReport.objects.create(deployment=deployment, report=report, effective_from=active_from,
                                    created_by="system:test")
    return deployment


@pytest.fixture
def ingest(db):
    """Usage as if reported at `now` (default: the event's own time), bypassing the API."""
    from metering.usage import usage_ingest

    def send(deployment, events: list[tuple[str, str]], *, now: datetime | None = None, prefix: str | None = None):
        prefix = prefix or uuid.uuid4().hex[:8]
        batch = [{"idempotency_key": f"{prefix}-{i}", "deployment": str(deployment.pk),
                  "timestamp": at(when).isoformat(), "gpu_hours": hours} for i, (when, hours) in enumerate(events)]
        latest = max(at(when) for when, _ in events)
        results = usage_ingest(organization_id=deployment.organization_id, events=batch, now=now or latest)
        assert [r.status.value for r in results] == ["created"] * len(events), [r.as_dict() for r in results]
        return results

    return send


@pytest.fixture
def operator_org(make_org, billing_settings):
    return make_org(OPERATOR)


@pytest.fixture
def billed(make_org, make_report, make_contract, make_deployment, ingest, billing_settings):
    """January 2025 billed, draft invoices keyed by organization slug:
    acme: big (h200) 62.5 h x 0.25 = 15.625 saved h x 4.00 = 62.50 savings, fee 12.50;
          prod (h100) 200 h x 0.2 = 40 saved h x 2.50 = 100.00 savings, fee 20.00; total 32.50
    beta: main 100 h x 0.5 x 2.50 = 125.00 savings, fee 25.00, cap line -15.00; total 10.00"""
    from metering.billing import billing_run_create
    from metering.models import Invoice
    from metering.periods import Period

    acme, beta = make_org("acme"), make_org("beta")
    make_contract(acme)
    make_contract(beta, monthly_cap="10.00")
    ingest(make_deployment(acme, make_report(acme, ci_low="1.2"), name="prod"), [("2025-01-10 00:00", "200")])
    ingest(make_deployment(acme, make_report(acme, ci_low="1.25", hardware="gpu-h200"), name="big"),
           [("2025-01-11 00:00", "62.5")])
    ingest(make_deployment(beta, make_report(beta, ci_low="1.5"), name="main"), [("2025-01-12 00:00", "100")])
    run, _ = billing_run_create(period=Period(2025, 1), actor="system:test")
    return {invoice.organization.slug: invoice for invoice in Invoice.objects.filter(run=run)
            .select_related("organization")}
