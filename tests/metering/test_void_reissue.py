"""Void and reissue: a void invoice keeps its number and lines and releases its usage, which the
next billing run bills again, or invoice_reissue bills at once on a corrective invoice with the
next number; released usage is billed again exactly once, and caps count only what non-void
invoices billed, net of credit notes. Figures from the `billed` fixture (conftest.py)."""

from __future__ import annotations

from datetime import date
from decimal import Decimal

import pytest
from django.db import IntegrityError, connection, transaction

from tests.metering.conftest import at

D = Decimal
pytestmark = pytest.mark.django_db


def _lines(invoice):
    return [(line.kind, line.usage_period, line.hours, line.fee, line.reason)
            for line in invoice.lines.order_by("position")]


def _reconciled(period: str) -> None:
    from metering.periods import Period
    from metering.reconcile import reconcile_period

    result = reconcile_period(period=Period.parse(period))
    assert result.ok, [str(d) for d in result.differences]


def test_it_bills_a_void_invoices_usage_again_in_the_next_run_on_a_new_number(billed):
    from metering.billing import billing_run_create
    from metering.invoices import invoice_finalize, invoice_void
    from metering.models import Invoice, Reissue
    from metering.periods import Period

    acme = invoice_finalize(invoice=billed["acme"], actor="system:test")
    before = _lines(acme)
    void = invoice_void(invoice=acme, actor="system:test", reason="billed to the wrong entity")
    assert void.status == "void" and void.number == acme.number and _lines(void) == before  # kept for audit

    february, _ = billing_run_create(period=Period(2025, 2), actor="system:test")
    again = Invoice.objects.get(run=february, organization=acme.organization)
    assert _lines(again) == [("adjustment", date(2025, 1, 1), hours, fee, reason)
                             for _, _, hours, fee, reason in before]
    assert again.total == D("32.50") and f"billed again (void {acme.number})" in again.lines.first().description
    assert Reissue.objects.get(voided=acme).invoice == again and february.summary["reissued"] == [acme.number]
    again = invoice_finalize(invoice=again, actor="system:test")
    year = again.finalized_at.year
    assert (acme.number, again.number) == (f"INV-{year}-000001", f"INV-{year}-000002")

    march, _ = billing_run_create(period=Period(2025, 3), actor="system:test")
    assert not Invoice.objects.filter(run=march).exists()  # billed again once, not twice
    _reconciled("2025-03")


def test_it_reissues_at_once_on_a_corrective_invoice_of_the_same_run(billed):
    from metering.billing import billing_run_create
    from metering.errors import BillingError
    from metering.invoices import invoice_finalize, invoice_reissue
    from metering.models import Invoice
    from metering.periods import Period

    acme = invoice_finalize(invoice=billed["acme"], actor="system:test")
    corrective = invoice_reissue(invoice=acme, actor="system:test", reason="wrong purchase order")
    acme.refresh_from_db()
    assert acme.status == "void" and acme.reissue.invoice == corrective
    assert (corrective.status, corrective.run_id, corrective.period) == ("finalized", acme.run_id, acme.period)
    assert corrective.number[-6:] == "000002" and corrective.total == acme.total == D("32.50")
    assert [line[2:] for line in _lines(corrective)] == [line[2:] for line in _lines(acme)]
    assert corrective.lines.filter(record__reissue__voided=acme).count() == 2  # its records name the reissue
    with pytest.raises(BillingError, match="billed again on invoice"):
        invoice_reissue(invoice=acme, actor="system:test")
    with pytest.raises(BillingError, match="draft"):
        invoice_reissue(invoice=billed["beta"], actor="system:test", reason="typo")

    february, _ = billing_run_create(period=Period(2025, 2), actor="system:test")
    assert not Invoice.objects.filter(run=february).exists()
    _reconciled("2025-02")


def test_it_bills_a_plain_void_at_once_when_asked_and_never_twice(billed):
    from metering.billing import billing_run_create
    from metering.invoices import invoice_finalize, invoice_reissue, invoice_void
    from metering.models import Invoice
    from metering.periods import Period

    acme = invoice_void(invoice=invoice_finalize(invoice=billed["acme"], actor="system:test"), actor="system:test",
                        reason="disputed")
    corrective = invoice_reissue(invoice=acme, actor="system:test")
    assert corrective.total == D("32.50") and corrective.status == "finalized"
    february, _ = billing_run_create(period=Period(2025, 2), actor="system:test")
    assert not Invoice.objects.filter(run=february).exists() and february.summary["reissued"] == []


def test_it_keeps_everything_as_it_was_when_a_reissue_fails_half_way(billed, monkeypatch):
    from metering import invoices
    from metering.models import DocumentCounter, Invoice, Reissue

    acme = invoices.invoice_finalize(invoice=billed["acme"], actor="system:test")

    def broken(**kwargs):
        raise RuntimeError("the database went away while finalizing")

    monkeypatch.setattr(invoices, "invoice_finalize", broken)
    with pytest.raises(RuntimeError):
        invoices.invoice_reissue(invoice=acme, actor="system:test", reason="wrong address")
    acme.refresh_from_db()
    assert acme.status == "finalized" and acme.voided_at is None
    assert Invoice.objects.count() == 2 and not Reissue.objects.exists()
    assert DocumentCounter.objects.get(series="INV").last == 1


def test_it_frees_a_void_invoices_share_of_the_cap(billed, ingest):
    """beta (cap 10.00): 100 h bill 25.00, capped to 10.00. Voided, its usage re-bills with the
    whole cap free again; counted as billed, it would re-bill at 0.00."""
    from metering.billing import billing_run_create
    from metering.invoices import invoice_finalize, invoice_reissue, invoice_void
    from metering.models import Deployment, Invoice
    from metering.periods import Period

    beta = invoice_finalize(invoice=billed["beta"], actor="system:test")
    corrective = invoice_reissue(invoice=beta, actor="system:test", reason="wrong VAT id")
    assert [(k, fee) for k, _, _, fee, _ in _lines(corrective)] == [("usage", D("25.00")), ("cap", D("-15.00"))]
    assert corrective.total == D("10.00")

    # Voided again and left to the next run, together with late January usage: one capped month.
    invoice_void(invoice=corrective, actor="system:test", reason="customer asked for one invoice")
    ingest(Deployment.objects.get(name="main"), [("2025-01-31 12:00", "10")], now=at("2025-02-02 00:00"))
    february, _ = billing_run_create(period=Period(2025, 2), actor="system:test")
    again = Invoice.objects.get(run=february, organization=beta.organization)
    assert [(k, hours, fee) for k, _, hours, fee, _ in _lines(again)] == [
        ("adjustment", D("110"), D("27.50")), ("cap", D("0"), D("-17.50"))]
    assert again.total == D("10.00")
    _reconciled("2025-02")


def test_it_counts_credit_notes_out_of_what_a_month_used_of_its_cap(billed, ingest):
    """beta's January billed 10.00 of its 10.00 cap; a 5.00 credit leaves 5.00 of it, so 2.50 of
    late January usage bills in full (without the credit: a -2.50 cap line, 0.00)."""
    from metering.billing import billing_run_create
    from metering.invoices import credit_note_issue, invoice_finalize
    from metering.models import Deployment, Invoice
    from metering.periods import Period

    beta = invoice_finalize(invoice=billed["beta"], actor="system:test")
    credit_note_issue(invoice=beta, actor="system:test", reason_code="service_credit",
                      amounts={beta.lines.get(kind="usage").pk: "5.00"})
    ingest(Deployment.objects.get(name="main"), [("2025-01-31 12:00", "10")], now=at("2025-02-02 00:00"))
    february, _ = billing_run_create(period=Period(2025, 2), actor="system:test")
    late = Invoice.objects.get(run=february, organization=beta.organization)
    assert [(k, fee) for k, _, _, fee, _ in _lines(late)] == [("adjustment", D("2.50"))]
    _reconciled("2025-02")


def test_it_refuses_what_void_and_reissue_must_not_do(billed):
    from metering.errors import BillingError
    from metering.invoices import credit_note_issue, invoice_finalize, invoice_reissue, invoice_void
    from metering.models import Reissue

    acme = invoice_finalize(invoice=billed["acme"], actor="system:test")
    credit_note_issue(invoice=acme, actor="system:test", reason_code="goodwill",
                      amounts={acme.lines.first().pk: "1.00"})
    with pytest.raises(BillingError, match="credit notes"):
        invoice_reissue(invoice=acme, actor="system:test", reason="late")
    with pytest.raises(BillingError, match="say why"):
        invoice_reissue(invoice=invoice_finalize(invoice=billed["beta"], actor="system:test"), actor="system:test")

    beta = invoice_void(invoice=billed["beta"], actor="system:test", reason="test")
    corrective = invoice_reissue(invoice=beta, actor="system:test")
    reissue = Reissue.objects.get(voided=beta)
    with pytest.raises(IntegrityError, match="written once"), transaction.atomic():
        Reissue.objects.filter(pk=reissue.pk).update(created_by="someone else")
    with pytest.raises(IntegrityError, match="only a void invoice"), transaction.atomic():
        Reissue.objects.create(voided=acme, invoice=corrective)
    with pytest.raises(IntegrityError), transaction.atomic():  # one reissue per void invoice
        Reissue.objects.create(voided=beta, invoice=corrective)


@pytest.mark.django_db(transaction=True)
def test_it_bills_released_usage_once_when_a_run_and_a_reissue_race(billed):
    import threading

    from metering.billing import billing_run_create
    from metering.invoices import invoice_finalize, invoice_reissue, invoice_void
    from metering.models import BillingRecord, Reissue, UsageEvent
    from metering.periods import Period

    acme = invoice_void(invoice=invoice_finalize(invoice=billed["acme"], actor="system:test"), actor="system:test",
                        reason="race")
    start = threading.Barrier(2)
    failures: list[BaseException] = []

    def act(action) -> None:
        try:
            start.wait(timeout=30)
            action()
        except BaseException as exc:  # noqa: BLE001 - a loser's refusal is checked below
            failures.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=act, args=(lambda: billing_run_create(period=Period(2025, 2),
                                                                             actor="system:test"),)),
               threading.Thread(target=act, args=(lambda: invoice_reissue(invoice=acme, actor="system:test"),))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    # Whichever came second found the usage billed again already (the reissue says so; the run skips it).
    assert all("billed again on invoice" in str(exc) for exc in failures), failures
    assert Reissue.objects.filter(voided=acme).count() == 1
    on_invoices = sum((r.hours for r in BillingRecord.objects.exclude(line__invoice__status="void")), D(0))
    assert on_invoices == sum((e.gpu_hours for e in UsageEvent.objects.all()), D(0))
