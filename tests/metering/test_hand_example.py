"""A billing example computed by hand, to the cent, through the real services and PostgreSQL.

Contract of acme from 2025-01: share 0.20, gpu-h100 at 2.50 EUR/GPU-hour, gpu-h200 at 4.00,
minimum speedup 1.05, rounding half-even, no cap. Contract of beta: the same but half-up and a
monthly cap of 10.00 EUR.

January 2025, acme (lines in deployment-name order):
  edge  (h100, report CI low 1.05, exactly the minimum, so billable): 1 h
        saved = 1 x (1.05 - 1) = 0.05 h; savings = 0.05 x 2.50 = 0.125 -> half-even 0.12
        fee = 0.20 x 0.125 = 0.025 -> half-even 0.02 (half-up would give 0.13 and 0.03)
  h200  (h200, report unstable, CI low 1.50): 10 h -> speedup billed as 1, fee 0.00, unstable_report
  prod  (h100) under report A (CI low 1.2345) until 2025-01-16, then re-audit B (CI low 1.1111):
        A: 100.5 + 200.25 = 300.75 h; saved = 300.75 x 0.2345 = 70.525875 h
           savings = 70.525875 x 2.50 = 176.3146875 -> 176.31
           fee = 0.20 x 176.3146875 = 35.2629375 -> 35.26
        B: 50.125 h; saved = 50.125 x 0.1111 = 5.5688875 h
           savings = 5.5688875 x 2.50 = 13.92221875 -> 13.92; fee = 2.78444375 -> 2.78
  slow  (h100, CI low 1.04 < 1.05): 20 h -> fee 0.00, below_minimum
  total = 0.02 + 0.00 + 35.26 + 2.78 + 0.00 = 38.06

January 2025, beta (half-up, cap 10.00):
  edge  (CI low 1.05): 1 h -> savings 0.125 -> 0.13, fee 0.025 -> 0.03
  main  (CI low 1.50): 100 h -> saved 50 h, savings 125.00, fee 25.00
  sum 25.03 > cap 10.00 -> cap line -15.03; total 10.00

February 2025 (usage of January arriving after January's run becomes an adjustment):
  acme prod under B: 10 h; saved 1.111 h; savings 2.7775 -> 2.78; fee 0.5555 -> 0.56
  acme edge late January usage: 2 h; saved 0.1 h; savings 0.25; fee 0.05 (adjustment line)
  acme total = 0.56 + 0.05 = 0.61
  beta main late January usage: 10 h; fee 2.50, but January already billed the cap 10.00, so the
  remaining cap is 0.00: adjustment 2.50 and cap line -2.50; total 0.00
"""

from __future__ import annotations

from datetime import date
from decimal import Decimal

import pytest

from tests.metering.conftest import at, unchecked_deployment

D = Decimal
pytestmark = pytest.mark.django_db


@pytest.fixture
def world(make_org, make_report, make_contract, make_deployment, ingest, billing_settings):
    from metering.deployments import deployment_switch_report

    acme, beta = make_org("acme"), make_org("beta")
    make_contract(acme)
    make_contract(beta, rounding="half_up", monthly_cap="10.00")
    report_a = make_report(acme, ci_low="1.2345")
    prod = make_deployment(acme, report_a, name="prod")
    report_b = make_report(acme, ci_low="1.1111", supersedes=report_a)
    deployment_switch_report(actor="system:test", deployment=prod, report=report_b,
                             effective_from=at("2025-01-16 00:00"))
    edge = make_deployment(acme, make_report(acme, ci_low="1.05"), name="edge")
    h200 = unchecked_deployment(acme, make_report(acme, hardware="gpu-h200", ci_low="1.50", stable=False), name="h200")
    slow = make_deployment(acme, make_report(acme, ci_low="1.04"), name="slow")
    beta_edge = make_deployment(beta, make_report(beta, ci_low="1.05"), name="edge")
    beta_main = make_deployment(beta, make_report(beta, ci_low="1.50"), name="main")
    ingest(prod, [("2025-01-05 10:00", "100.5"), ("2025-01-10 10:00", "200.25"), ("2025-01-20 10:00", "50.125")])
    ingest(edge, [("2025-01-07 00:00", "1")])
    ingest(h200, [("2025-01-08 00:00", "10")])
    ingest(slow, [("2025-01-09 00:00", "20")])
    ingest(beta_edge, [("2025-01-07 00:00", "1")])
    ingest(beta_main, [("2025-01-07 00:00", "100")])
    return {"acme": acme, "beta": beta, "prod": prod, "edge": edge, "beta_main": beta_main,
            "report_a": report_a, "report_b": report_b}


def _lines(invoice):
    return [(line.kind, line.fee, line.reason) for line in invoice.lines.order_by("position")]


def test_it_bills_the_hand_computed_example_to_the_cent(world, ingest):
    from metering.billing import billing_run_create
    from metering.models import Invoice
    from metering.periods import Period

    run, created = billing_run_create(period=Period(2025, 1), actor="system:test")
    assert created
    acme = Invoice.objects.get(run=run, organization=world["acme"])
    assert _lines(acme) == [
        ("usage", D("0.02"), ""),
        ("usage", D("0.00"), "unstable_report"),
        ("usage", D("35.26"), ""),
        ("usage", D("2.78"), ""),
        ("usage", D("0.00"), "below_minimum"),
    ]
    assert acme.total == D("38.06")
    prod_a = acme.lines.get(position=3).record
    assert (prod_a.hours, prod_a.saved_hours, prod_a.savings_exact, prod_a.fee_exact, prod_a.savings) == (
        D("300.75"), D("70.525875"), D("176.3146875"), D("35.2629375"), D("176.31"))
    assert prod_a.report_sha256 == world["report_a"].body_sha256
    assert prod_a.report_signature == world["report_a"].signature
    assert (prod_a.span_start, prod_a.span_end) == (at("2025-01-01 00:00"), at("2025-01-16 00:00"))
    assert acme.lines.get(position=4).record.report_id == world["report_b"].pk
    edge = acme.lines.get(position=1)
    assert (edge.savings, edge.fee) == (D("0.12"), D("0.02"))

    beta = Invoice.objects.get(run=run, organization=world["beta"])
    assert _lines(beta) == [("usage", D("0.03"), ""), ("usage", D("25.00"), ""), ("cap", D("-15.03"), "cap")]
    assert beta.lines.get(position=1).savings == D("0.13")
    assert beta.total == D("10.00")

    # Late January usage, and February's own usage, go to February's run.
    ingest(world["edge"], [("2025-01-31 12:00", "2")], now=at("2025-02-02 00:00"))
    ingest(world["beta_main"], [("2025-01-31 12:00", "10")], now=at("2025-02-02 00:00"))
    ingest(world["prod"], [("2025-02-03 00:00", "10")])
    february, _ = billing_run_create(period=Period(2025, 2), actor="system:test")
    acme_feb = Invoice.objects.get(run=february, organization=world["acme"])
    assert _lines(acme_feb) == [("usage", D("0.56"), ""), ("adjustment", D("0.05"), "")]
    assert acme_feb.lines.get(position=2).usage_period == date(2025, 1, 1)
    assert acme_feb.total == D("0.61")
    beta_feb = Invoice.objects.get(run=february, organization=world["beta"])
    assert _lines(beta_feb) == [("adjustment", D("2.50"), ""), ("cap", D("-2.50"), "cap")]
    assert beta_feb.total == D("0.00")


def test_it_changes_nothing_when_a_period_is_billed_again(world, ingest):
    from metering.billing import billing_run_create
    from metering.models import BillingRecord, Invoice, InvoiceLine
    from metering.periods import Period

    first, created = billing_run_create(period=Period(2025, 1), actor="system:test")
    counts = (Invoice.objects.count(), InvoiceLine.objects.count(), BillingRecord.objects.count())
    ingest(world["prod"], [("2025-01-30 00:00", "5")], now=at("2025-02-01 00:00"))
    again, created_again = billing_run_create(period=Period(2025, 1), actor="system:test")
    assert created and not created_again and again.pk == first.pk
    assert (Invoice.objects.count(), InvoiceLine.objects.count(), BillingRecord.objects.count()) == counts


def test_it_reconciles_the_example_from_raw_events(world, ingest, capsys):
    from django.core.management import call_command

    from metering.billing import billing_run_create
    from metering.periods import Period

    billing_run_create(period=Period(2025, 1), actor="system:test")
    ingest(world["edge"], [("2025-01-31 12:00", "2")], now=at("2025-02-02 00:00"))
    billing_run_create(period=Period(2025, 2), actor="system:test")
    call_command("reconcile", period="2025-02")
    out = capsys.readouterr().out
    assert "no difference" in out and "0.05 EUR" in out
