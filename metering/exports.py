"""Finance exports: one invoice as CSV, XLSX or PDF, and a period's revenue-share summary as CSV
or XLSX. Amounts are exact decimals (never floats) and every line names its signed report. The
summary counts revenue as the dashboard and the invoice list do (selectors.revenue_lines)."""

from __future__ import annotations

import io
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pandas as pd
from django.db.models import Sum
from django.template.loader import render_to_string

from metering.invoices import credited_by_line, invoice_balance, money, plain
from metering.models import Invoice, InvoiceStatus
from metering.periods import Period
from metering.selectors import EVERY_ORGANIZATION, revenue_lines, revenue_totals

FORMATS = {
    "csv": "text/csv; charset=utf-8",
    "xlsx": "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
    "pdf": "application/pdf",
}


@dataclass(frozen=True)
class Table:
    columns: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]

    def frame(self) -> pd.DataFrame:
        # object dtype keeps Decimal values exact all the way into the file
        return pd.DataFrame(list(self.rows), columns=list(self.columns), dtype=object)


# A text cell starting with one of these is a formula (or becomes one) in a spreadsheet program
# (OWASP, CSV injection): deployment names, descriptions and reasons are typed by customers.
FORMULA_TRIGGERS = ("=", "+", "-", "@", "\t", "\r")


def neutralised(value: Any) -> Any:
    """A text value that a spreadsheet would read as a formula, made inert with a leading quote;
    numbers (Decimal, int) and other text pass unchanged."""
    if isinstance(value, str) and value.startswith(FORMULA_TRIGGERS):
        return "'" + value
    return value


def to_csv(table: Table) -> bytes:
    safe = Table(table.columns, tuple(tuple(neutralised(v) for v in row) for row in table.rows))
    return safe.frame().to_csv(index=False, lineterminator="\n").encode()


def to_xlsx(sheets: dict[str, Table]) -> bytes:
    """Every text cell is written as text (never a formula), whatever it starts with."""
    buffer = io.BytesIO()
    with pd.ExcelWriter(buffer, engine="openpyxl") as writer:
        for name, table in sheets.items():
            table.frame().to_excel(writer, sheet_name=name[:31], index=False)
            sheet = writer.sheets[name[:31]]
            for row in sheet.iter_rows():
                for cell in row:
                    if isinstance(cell.value, str):
                        cell.data_type = "s"  # a string, also when it starts with "="
    return buffer.getvalue()


def export_filename(invoice: Invoice, fmt: str) -> str:
    return f"{invoice.number or f'draft-{str(invoice.pk)[:8]}'}-{invoice.organization.slug}.{fmt}"


LINE_COLUMNS = ("position", "kind", "usage_period", "description", "deployment", "hardware", "report",
                "report_sha256", "report_key_id", "hours", "speedup", "saved_hours", "price_per_hour", "share",
                "savings", "fee", "credited", "reason", "currency")


def invoice_lines_table(invoice: Invoice) -> Table:
    """One row per line, then a total row; the total is the sum of the rounded line fees."""
    credited = credited_by_line(invoice)
    rows = []
    for line in invoice.lines.select_related("record", "record__deployment").order_by("position"):
        record = line.record
        rows.append((
            line.position, line.kind, Period.of(line.usage_period).name, line.description,
            record.deployment.name if record else "", record.hardware if record else "",
            str(record.report_id) if record else "", record.report_sha256 if record else "",
            record.report_key_id if record else "", line.hours, line.speedup, Decimal(plain(line.saved_hours)),
            line.price_per_hour, line.share, _money(line.savings, invoice.currency),
            _money(line.fee, invoice.currency), _money(credited.get(line.pk, Decimal(0)), invoice.currency),
            line.reason, invoice.currency))
    rows.append(("", "total", Period.of(invoice.period).name, f"Invoice {invoice} total", "", "", "", "", "",
                 "", "", "", "", "", "", _money(invoice.total, invoice.currency),
                 _money(sum(credited.values(), Decimal(0)), invoice.currency), "", invoice.currency))
    return Table(LINE_COLUMNS, tuple(rows))


def invoice_header_table(invoice: Invoice) -> Table:
    rows = [("invoice", str(invoice)), ("status", invoice.status), ("organization", invoice.organization.name),
            ("period", Period.of(invoice.period).name), ("currency", invoice.currency),
            ("total", _money(invoice.total, invoice.currency)),
            ("balance", _money(invoice_balance(invoice), invoice.currency)),
            ("finalized_at", invoice.finalized_at.isoformat() if invoice.finalized_at else ""),
            ("void_reason", invoice.void_reason), ("invoice_id", str(invoice.pk)),
            ("billing_run", str(invoice.run_id))]
    return Table(("field", "value"), tuple(rows))


def invoice_csv(invoice: Invoice) -> bytes:
    return to_csv(invoice_lines_table(invoice))


def invoice_xlsx(invoice: Invoice) -> bytes:
    return to_xlsx({"Invoice": invoice_header_table(invoice), "Lines": invoice_lines_table(invoice)})


def invoice_pdf(invoice: Invoice) -> bytes:
    # Imported late: loading pango takes a moment and only PDFs need it.
    from weasyprint import HTML
    from weasyprint.urls import URLFetcher

    credited = credited_by_line(invoice)
    lines = list(invoice.lines.select_related("record", "record__deployment").order_by("position"))
    html = render_to_string("metering/invoice_pdf.html", {
        "invoice": invoice, "lines": [(line, credited.get(line.pk)) for line in lines],
        "credit_notes": invoice.credit_notes.order_by("created_at"), "balance": invoice_balance(invoice),
        "period": Period.of(invoice.period), "draft": invoice.status == InvoiceStatus.DRAFT,
    })
    # The PDF fetches nothing (as the report PDF): its styles are inline, and a customer's text that
    # became a URL could otherwise read file:// paths of this host or reach http:// ones from it.
    return HTML(string=html, url_fetcher=URLFetcher(allowed_protocols=("data",))).write_pdf()


def invoice_export(invoice: Invoice, fmt: str) -> bytes:
    exporters = {"csv": invoice_csv, "xlsx": invoice_xlsx, "pdf": invoice_pdf}
    return exporters[fmt](invoice)


REVENUE_COLUMNS = ("organization", "invoice", "status", "currency", "hardware", "kind", "hours", "saved_hours",
                   "savings", "revenue", "credited", "net")


def revenue_share_table(period: Period) -> Table:
    """Per organization, finalized invoice, hardware class and line kind: what the period's
    invoices billed, what credit notes took off, and the net; then the net per currency. Drafts
    (not owed yet) and void invoices (never owed) are left out, as on the revenue dashboard."""
    rows: list[tuple[Any, ...]] = []
    lines = revenue_lines(access=EVERY_ORGANIZATION, period=period.first_day)
    grouped = (lines.values("invoice__organization__slug", "invoice__number", "invoice__status", "invoice__currency",
                            "record__hardware", "kind")
               .annotate(hours=Sum("hours"), saved=Sum("saved_hours"), savings=Sum("savings"), fee=Sum("fee"),
                         credited_sum=Sum("credited"))
               .order_by("invoice__organization__slug", "invoice__currency", "invoice__number", "record__hardware",
                         "kind"))
    for row in grouped:
        currency = row["invoice__currency"]
        rows.append((row["invoice__organization__slug"], row["invoice__number"], row["invoice__status"], currency,
                     row["record__hardware"] or "", row["kind"], row["hours"], Decimal(plain(row["saved"])),
                     _money(row["savings"], currency), _money(row["fee"], currency),
                     _money(row["credited_sum"], currency), _money(row["fee"] - row["credited_sum"], currency)))
    for total in revenue_totals(lines, "invoice__currency"):
        currency = total["currency"]
        rows.append(("total", "", "finalized, net of credit notes", currency, "", "", "", "", "",
                     _money(total["invoiced"], currency), _money(total["credited"], currency),
                     _money(total["net"], currency)))
    return Table(REVENUE_COLUMNS, tuple(rows))


def revenue_share_export(period: Period, fmt: str) -> bytes:
    table = revenue_share_table(period)
    if fmt == "csv":
        return to_csv(table)
    return to_xlsx({f"Revenue share {period}": table})


def _money(amount: Decimal, currency: str) -> Decimal:
    return Decimal(money(amount, currency))  # type: ignore[arg-type]
