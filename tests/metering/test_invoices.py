"""Invoices: gapless numbering at finalization, voiding, credit notes and the exports."""

from __future__ import annotations

import csv
import io
import threading
from decimal import Decimal

import openpyxl
import pytest
from django.db import connection, transaction

D = Decimal
pytestmark = pytest.mark.django_db


def test_it_numbers_invoices_gaplessly_in_finalization_order(billed):
    from metering.invoices import invoice_finalize

    acme, beta = billed["acme"], billed["beta"]
    with pytest.raises(RuntimeError), transaction.atomic():
        invoice_finalize(invoice=acme, actor="system:test")
        raise RuntimeError("the caller's transaction fails after finalizing")
    acme.refresh_from_db()
    assert acme.status == "draft" and acme.number is None  # the number went back with the rollback
    first = invoice_finalize(invoice=beta, actor="system:test")
    second = invoice_finalize(invoice=acme, actor="system:test")
    year = first.finalized_at.year
    assert (first.number, second.number) == (f"INV-{year}-000001", f"INV-{year}-000002")


def test_it_refuses_transitions_outside_the_state_machine(billed):
    from metering.errors import BillingError
    from metering.invoices import invoice_finalize, invoice_void

    acme = billed["acme"]
    with pytest.raises(BillingError, match="cannot become void"):
        invoice_void(invoice=acme, actor="system:test", reason="typo")
    invoice_finalize(invoice=acme, actor="system:test")
    with pytest.raises(BillingError, match="cannot become finalized"):
        invoice_finalize(invoice=acme, actor="system:test")
    with pytest.raises(BillingError, match="say why"):
        invoice_void(invoice=acme, actor="system:test", reason=" ")
    voided = invoice_void(invoice=acme, actor="system:test", reason="issued to the wrong entity")
    assert voided.status == "void" and voided.number.startswith("INV-")
    with pytest.raises(BillingError, match="cannot become"):
        invoice_void(invoice=acme, actor="system:test", reason="again")


def test_it_credits_part_of_a_line_then_the_rest_and_never_more(billed):
    from metering.errors import BillingError
    from metering.invoices import credit_note_issue, invoice_balance, invoice_finalize

    acme = invoice_finalize(invoice=billed["acme"], actor="system:test")
    big, prod = acme.lines.order_by("position")
    note = credit_note_issue(invoice=acme, actor="system:test", reason_code="report_dispute",
                             memo="re-audit pending", amounts={prod.pk: "5.00"})
    assert (note.total, note.full, note.number.startswith("CN-")) == (D("5.00"), False, True)
    assert invoice_balance(acme) == D("27.50")
    with pytest.raises(BillingError, match="at most 15.00 more"):
        credit_note_issue(invoice=acme, actor="system:test", reason_code="billing_error", amounts={prod.pk: "15.01"})
    with pytest.raises(BillingError, match="whole EUR minor units"):
        credit_note_issue(invoice=acme, actor="system:test", reason_code="billing_error", amounts={big.pk: "0.005"})
    with pytest.raises(BillingError, match="reason_code"):
        credit_note_issue(invoice=acme, actor="system:test", reason_code="because", amounts={big.pk: "1.00"})
    rest = credit_note_issue(invoice=acme, actor="system:test", reason_code="billing_error")
    assert rest.full and rest.total == D("27.50")
    assert invoice_balance(acme) == D("0.00")
    with pytest.raises(BillingError, match="nothing left"):
        credit_note_issue(invoice=acme, actor="system:test", reason_code="billing_error")


def test_it_reverses_the_cap_line_in_a_full_credit_note(billed):
    from metering.invoices import credit_note_issue, invoice_finalize

    beta = invoice_finalize(invoice=billed["beta"], actor="system:test")
    note = credit_note_issue(invoice=beta, actor="system:test", reason_code="goodwill")
    amounts = sorted(line.amount for line in note.lines.all())
    assert amounts == [D("-15.00"), D("25.00")] and note.total == D("10.00") == beta.total


def test_it_refuses_to_credit_a_draft(billed):
    from metering.errors import BillingError
    from metering.invoices import credit_note_issue

    with pytest.raises(BillingError, match="only finalized"):
        credit_note_issue(invoice=billed["acme"], actor="system:test", reason_code="goodwill")


def test_it_exports_an_invoice_as_csv_xlsx_and_pdf(billed):
    from metering.exports import invoice_csv, invoice_pdf, invoice_xlsx
    from metering.invoices import invoice_finalize

    acme = invoice_finalize(invoice=billed["acme"], actor="system:test")
    rows = list(csv.DictReader(io.StringIO(invoice_csv(acme).decode())))
    assert [(r["kind"], r["fee"], r["hardware"]) for r in rows] == [
        ("usage", "12.50", "gpu-h200"), ("usage", "20.00", "gpu-h100"), ("total", "32.50", "")]
    record = acme.lines.get(position=2).record
    assert rows[1]["report_sha256"] == record.report_sha256 and rows[1]["saved_hours"] == "40"
    workbook = openpyxl.load_workbook(io.BytesIO(invoice_xlsx(acme)))
    header = dict(workbook["Invoice"].iter_rows(min_row=2, values_only=True))
    assert header["invoice"] == acme.number and D(str(header["total"])) == D("32.50")
    lines = list(workbook["Lines"].iter_rows(values_only=True))
    assert lines[0][0] == "position" and D(str(lines[-1][15])) == D("32.50")
    pdf = invoice_pdf(acme)
    assert pdf.startswith(b"%PDF-") and len(pdf) > 2000


def test_it_writes_customer_text_as_inert_text_in_csv_and_xlsx(billed):
    """OWASP CSV injection: a deployment named like a formula must not become one in finance's sheet."""
    from metering.exports import invoice_csv, invoice_xlsx
    from metering.models import Deployment

    hostile = '=HYPERLINK("http://evil.test","x")'
    Deployment.objects.filter(name="prod").update(name=hostile)
    Deployment.objects.filter(name="big").update(name="+1-1")
    acme = billed["acme"]
    rows = list(csv.DictReader(io.StringIO(invoice_csv(acme).decode())))
    assert {r["deployment"] for r in rows if r["kind"] == "usage"} == {"'" + hostile, "'+1-1"}
    assert rows[0]["fee"] in ("12.50", "20.00")  # numbers are untouched
    workbook = openpyxl.load_workbook(io.BytesIO(invoice_xlsx(acme)))
    cells = [cell for row in workbook["Lines"].iter_rows(min_row=2) for cell in row if cell.value in (hostile, "+1-1")]
    assert len(cells) == 2 and all(cell.data_type == "s" for cell in cells)  # text, not a formula
    assert b"<f>" not in _sheet_xml(invoice_xlsx(acme))


@pytest.mark.parametrize("lead", ["=", "+", "-", "@", "\t", "\r"])
def test_it_neutralises_every_character_a_spreadsheet_reads_as_a_formula(lead):
    from metering.exports import neutralised

    assert neutralised(lead + "SUM(A1:A9)") == "'" + lead + "SUM(A1:A9)"
    assert neutralised("plain " + lead) == "plain " + lead  # only a leading character matters
    assert neutralised(D("-1.25")) == D("-1.25") and neutralised(-3) == -3  # numbers stay numbers


def _sheet_xml(data: bytes) -> bytes:
    import zipfile

    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        return b"".join(archive.read(name) for name in archive.namelist() if name.startswith("xl/worksheets/"))


def test_it_summarises_a_periods_revenue_share_from_finalized_invoices_net_of_credit_notes(billed):
    from metering.exports import revenue_share_table
    from metering.invoices import credit_note_issue, invoice_finalize, invoice_void
    from metering.periods import Period

    invoice_void(invoice=invoice_finalize(invoice=billed["beta"], actor="system:test"), actor="system:test",
                 reason="test")
    assert revenue_share_table(Period(2025, 1)).rows == ()  # a draft is not owed yet, a void invoice never
    acme = invoice_finalize(invoice=billed["acme"], actor="system:test")
    credit_note_issue(invoice=acme, actor="system:test", reason_code="goodwill",
                      amounts={acme.lines.get(position=2).pk: "1.25"})
    table = revenue_share_table(Period(2025, 1))
    rows = [dict(zip(table.columns, row)) for row in table.rows]
    assert [(r["organization"], r["invoice"], r["status"], r["hardware"], r["kind"], r["revenue"], r["credited"],
             r["net"]) for r in rows] == [
        ("acme", acme.number, "finalized", "gpu-h100", "usage", D("20.00"), D("1.25"), D("18.75")),
        ("acme", acme.number, "finalized", "gpu-h200", "usage", D("12.50"), D("0.00"), D("12.50")),
        ("total", "", "finalized, net of credit notes", "", "", D("32.50"), D("1.25"), D("31.25")),
    ]


@pytest.mark.django_db(transaction=True)
def test_it_numbers_concurrent_finalizations_without_gaps_or_repeats(billed):
    from metering.invoices import invoice_finalize

    numbers: list[str] = []
    start = threading.Barrier(2)

    def finalize(invoice) -> None:
        try:
            start.wait(timeout=30)
            numbers.append(invoice_finalize(invoice=invoice, actor="system:test").number)
        finally:
            connection.close()

    threads = [threading.Thread(target=finalize, args=(billed[slug],)) for slug in ("acme", "beta")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(n[-6:] for n in numbers) == ["000001", "000002"]
