"""Plain dicts of metering objects for the API and the pages: money as decimal strings, never
floats; one shape per object, one place."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.urls import reverse

from metering.invoices import credited_by_line, invoice_balance, money, plain
from metering.models import BillingRun, CreditNote, Invoice, InvoiceLine
from metering.periods import Period


def line_dict(line: InvoiceLine, currency: str, credited: Decimal | None = None) -> dict[str, Any]:
    data: dict[str, Any] = {
        "id": line.pk, "position": line.position, "kind": line.kind, "usage_period": Period.of(line.usage_period).name,
        "description": line.description, "hours": str(line.hours), "speedup": str(line.speedup),
        "saved_hours": plain(line.saved_hours), "price_per_hour": str(line.price_per_hour),
        "share": str(line.share), "savings": money(line.savings, currency), "fee": money(line.fee, currency),
        "reason": line.reason or None, "credited": money(credited or Decimal(0), currency),
    }
    record = line.record
    if record is not None:
        data["billing_record"] = {
            "id": record.pk, "deployment": str(record.deployment_id), "hardware": record.hardware,
            "report": str(record.report_id), "report_sha256": record.report_sha256,
            "report_key_id": record.report_key_id, "report_signature": record.report_signature,
            "ci_low": str(record.ci_low), "stable": record.stable, "events": record.events,
            "span": [record.span_start.isoformat(), record.span_end.isoformat()],
            "savings_exact": plain(record.savings_exact), "fee_exact": plain(record.fee_exact),
            "contract": str(record.contract_id), "rounding": record.rounding,
        }
    return data


def credit_note_dict(note: CreditNote) -> dict[str, Any]:
    return {
        "id": str(note.pk), "number": note.number, "invoice": str(note.invoice_id), "reason_code": note.reason_code,
        "memo": note.memo, "full": note.full, "currency": note.currency, "total": money(note.total, note.currency),
        "created_at": note.created_at.isoformat(),
        "lines": [{"invoice_line": cl.invoice_line_id, "amount": money(cl.amount, note.currency)}
                  for cl in note.lines.all()],
    }


def invoice_dict(invoice: Invoice, *, with_lines: bool = False) -> dict[str, Any]:
    data: dict[str, Any] = {
        "id": str(invoice.pk), "number": invoice.number, "organization": invoice.organization.slug,
        "period": Period.of(invoice.period).name, "currency": invoice.currency, "status": invoice.status,
        "total": money(invoice.total, invoice.currency),
        "balance": money(invoice_balance(invoice), invoice.currency),
        "billing_run": str(invoice.run_id), "created_at": invoice.created_at.isoformat(),
        "finalized_at": invoice.finalized_at.isoformat() if invoice.finalized_at else None,
        "voided_at": invoice.voided_at.isoformat() if invoice.voided_at else None,
        "void_reason": invoice.void_reason or None,
        "links": {"self": reverse("api:invoice-detail", args=[invoice.pk]),
                  "page": reverse("metering:invoice", args=[invoice.pk])},
    }
    if with_lines:
        credited = credited_by_line(invoice)
        lines = invoice.lines.select_related("record").order_by("position")
        data["lines"] = [line_dict(line, invoice.currency, credited.get(line.pk)) for line in lines]
        data["credit_notes"] = [credit_note_dict(note) for note in
                                invoice.credit_notes.prefetch_related("lines").order_by("created_at")]
    return data


def billing_run_dict(run: BillingRun) -> dict[str, Any]:
    return {"id": str(run.pk), "period": Period.of(run.period).name, "cutoff": run.cutoff.isoformat(),
            "created_at": run.created_at.isoformat(), "created_by": run.created_by, "summary": run.summary,
            "links": {"page": reverse("metering:run", args=[run.pk])}}
