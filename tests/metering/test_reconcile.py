"""Reconcile recomputes billing by its own path (usage events, contract versions, S from each
signed report body), so a bug planted in billing's money rules shows as a difference, and honest
billing, voids, reissues, credit notes and caps included, shows none."""

from __future__ import annotations

import ast
import hashlib
import json
from decimal import Decimal
from pathlib import Path

import pytest

from tests.metering.conftest import at

D = Decimal
pytestmark = pytest.mark.django_db


@pytest.fixture
def world(make_org, make_report, make_contract, make_deployment, ingest, billing_settings):
    """acme: edge 1 h at S 1.05 (savings 0.125, fee 0.025: half-even 0.12 and 0.02), prod 200 h at
    S 1.2 (fee 20.00), slow 20 h at S 1.04 (under the minimum 1.05: 0.00); beta, cap 10.00: main
    100 h at S 1.5 (fee 25.00, capped to 10.00)."""
    acme, beta = make_org("acme"), make_org("beta")
    make_contract(acme)
    make_contract(beta, monthly_cap="10.00")
    deployments = {
        "edge": make_deployment(acme, make_report(acme, ci_low="1.05"), name="edge"),
        "prod": make_deployment(acme, make_report(acme, ci_low="1.2"), name="prod"),
        "slow": make_deployment(acme, make_report(acme, ci_low="1.04"), name="slow"),
        "main": make_deployment(beta, make_report(beta, ci_low="1.5"), name="main"),
    }
    ingest(deployments["edge"], [("2025-01-07 00:00", "1")])
    ingest(deployments["prod"], [("2025-01-10 00:00", "200")])
    ingest(deployments["slow"], [("2025-01-09 00:00", "20")])
    ingest(deployments["main"], [("2025-01-12 00:00", "100")])
    return deployments


def _bill(period: str):
    from metering.billing import billing_run_create
    from metering.periods import Period

    return billing_run_create(period=Period.parse(period), actor="system:test")[0]


def _differences(period: str) -> list[str]:
    from metering.periods import Period
    from metering.reconcile import reconcile_period

    return [str(d) for d in reconcile_period(period=Period.parse(period)).differences]


def _invoice(run, slug: str):
    from metering.models import Invoice

    return Invoice.objects.get(run=run, organization__slug=slug)


def test_it_finds_no_difference_in_honest_billing_with_voids_reissues_credits_and_caps(world, ingest):
    from metering.invoices import credit_note_issue, invoice_finalize, invoice_reissue, invoice_void

    january = _bill("2025-01")
    acme = invoice_finalize(invoice=_invoice(january, "acme"), actor="system:test")
    credit_note_issue(invoice=acme, actor="system:test", reason_code="goodwill",
                      amounts={acme.lines.get(position=2).pk: "3.00"})
    beta = invoice_finalize(invoice=_invoice(january, "beta"), actor="system:test")
    corrective = invoice_reissue(invoice=beta, actor="system:test", reason="wrong entity")
    invoice_void(invoice=corrective, actor="system:test", reason="merged into February")
    ingest(world["main"], [("2025-01-31 12:00", "4")], now=at("2025-02-02 00:00"))
    ingest(world["prod"], [("2025-01-31 12:00", "10"), ("2025-02-03 00:00", "10")], now=at("2025-02-03 00:00"))
    february = _bill("2025-02")
    assert _invoice(february, "beta").total == D("10.00")  # the released usage and the late usage, capped
    invoice_finalize(invoice=_invoice(february, "acme"), actor="system:test")
    invoice_reissue(invoice=invoice_finalize(invoice=_invoice(february, "beta"), actor="system:test"),
                    actor="system:test", reason="again")
    assert _differences("2025-02") == []
    assert _differences("2025-01") == []  # an earlier period, with later runs and reissues after it


def test_it_reports_a_rounding_bug_planted_in_the_fee_rules(world, monkeypatch):
    from metering import fees

    honest = fees.round_money

    def rounds_half_up(amount, *, currency, rounding):
        return honest(amount, currency=currency, rounding="half_up")  # ignores the contract's half-even

    monkeypatch.setattr(fees, "round_money", rounds_half_up)
    _bill("2025-01")
    monkeypatch.undo()
    found = _differences("2025-01")
    assert any("fee deployment" in d and "expected 0.02, stored 0.03" in d for d in found), found
    assert any("savings deployment" in d and "expected 0.12, stored 0.13" in d for d in found), found
    assert any("invoice total invoice" in d and "expected 20.02, stored 20.03" in d for d in found), found


def test_it_reports_a_formula_bug_planted_in_the_fee_rules(world, monkeypatch):
    from metering import fees

    honest = fees.billing_line

    def share_off_by_a_tenth(**kwargs):
        return honest(**{**kwargs, "share": fees.to_decimal(kwargs["share"], name="share") * D("1.1")})

    monkeypatch.setattr(fees, "billing_line", share_off_by_a_tenth)
    _bill("2025-01")
    monkeypatch.undo()
    found = _differences("2025-01")
    assert any("fee deployment" in d and "expected 20.00, stored 22.00" in d for d in found), found
    assert any("cap line month 2025-01" in d and "expected -15.00, stored -17.50" in d for d in found), found


def test_it_reports_a_gate_bug_planted_in_the_fee_rules(world, monkeypatch):
    from metering import fees

    honest = fees.billable_speedup

    def no_minimum(*, ci_low, minimum, stable=True):
        return honest(ci_low=ci_low, minimum="1", stable=stable)

    monkeypatch.setattr(fees, "billable_speedup", no_minimum)
    _bill("2025-01")
    monkeypatch.undo()
    found = _differences("2025-01")
    assert any("reason deployment" in d and "expected below_minimum, stored " in d for d in found), found
    assert any("speedup deployment" in d and "expected 1, stored 1.04" in d for d in found), found


def test_it_reports_a_cap_bug_planted_in_billing(world, monkeypatch):
    """A cap that still counts a void invoice's fees re-bills beta's voided January at 0.00."""
    from metering import billing
    from metering.invoices import invoice_finalize, invoice_void
    from metering.models import InvoiceLine

    january = _bill("2025-01")
    invoice_void(invoice=invoice_finalize(invoice=_invoice(january, "beta"), actor="system:test"),
                 actor="system:test", reason="wrong entity")

    def counts_void_invoices(*, organization_ids, months):
        used = {}
        for line in InvoiceLine.objects.filter(invoice__organization_id__in=set(organization_ids)):
            key = (line.invoice.organization_id, billing.Period.of(line.usage_period))
            used[key] = used.get(key, D(0)) + line.fee
        return used

    monkeypatch.setattr(billing, "cap_used", counts_void_invoices)
    february = _bill("2025-02")
    monkeypatch.undo()
    assert _invoice(february, "beta").total == D("0.00")
    found = _differences("2025-02")
    assert any("cap line month 2025-01" in d and "expected -15.00, stored -25.00" in d for d in found), found
    assert any("invoice total invoice" in d and "expected 10.00, stored 0.00" in d for d in found), found


def test_it_takes_S_from_the_signed_body_not_the_reports_column(make_org, make_report, make_contract,
                                                                make_deployment, ingest, billing_settings):
    """A report row whose copied-out column says 1.5 while its signed body says 1.25: billing
    bills the column; reconcile expects what the body states and says so."""
    from reports.models import Report
    from runs.models import Run

    org = make_org("acme")
    make_contract(org)
    signed = make_report(org, ci_low="1.25")
    body = json.loads(signed.body_bytes)
    body["run"]["id"] = "another run"  # a report of another run (another artifact: one report bills an artifact)
    raw = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    run = Run.objects.create(organization=org, model_version=signed.run.model_version, hardware="gpu-h100",
                             status="succeeded", artifact_sha256="d" * 64)
    doctored = Report.objects.create(organization=org, kind="run", run=run, hardware="gpu-h100", body=raw,
                                     body_sha256=hashlib.sha256(raw).hexdigest(), key_id="test-key-1",
                                     signature=signed.signature, model_speedup=D("1.6"), model_ci_low=D("1.5"),
                                     model_ci_high=D("1.7"), stable=True)
    ingest(make_deployment(org, doctored, name="prod"), [("2025-01-10 00:00", "100")])
    _bill("2025-01")
    found = _differences("2025-01")
    assert any("ci_low deployment" in d and "expected 1.25, stored 1.500000" in d for d in found), found
    assert any("fee deployment" in d and "expected 12.50, stored 25.00" in d for d in found), found


def test_it_checks_billing_without_the_code_it_checks():
    """reconcile.py imports neither the fee rules nor billing, and reads no report's model_ci_low."""
    source = Path(__file__).resolve().parents[2].joinpath("metering", "reconcile.py").read_text()
    tree = ast.parse(source)
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {f"{node.module}.{alias.name}" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                 for alias in node.names}
    assert not {name for name in imported if name.startswith(("metering.fees", "metering.billing"))}, imported
    assert "metering import fees" not in source and "metering import billing" not in source
    docstring = ast.get_docstring(tree) or ""
    code = source.replace(docstring, "")
    assert "model_ci_low" not in code


def test_it_reads_S_where_the_report_writer_signs_it():
    """The body reader follows reports.document's billing block, not a shape of its own."""
    from metering.reconcile import report_figure
    from reports.document import billing_statement

    def figure(result):
        body = json.dumps({"billing": billing_statement(result)}, sort_keys=True).encode()
        return report_figure(body, hashlib.sha256(body).hexdigest())

    stable = figure({"calibration": {"stable": True}, "model": {"speedup": 1.3, "ci95": [1.22, 1.38]},
                     "workloads": []})
    assert (stable.ci_low, stable.stable, stable.problem) == (D("1.22"), True, "")
    noisy = figure({"calibration": {"stable": False}, "model": {"speedup": 1.3, "ci95": [1.2199999, 1.38]},
                    "workloads": []})
    assert (noisy.ci_low, noisy.stable) == (D("1.2199"), False)  # rounded down to 4 places by the writer
    assert "states no decimal" in figure({"calibration": {"stable": True}, "workloads": []}).problem
    assert "does not hash" in report_figure(b"{}", "0" * 64).problem
