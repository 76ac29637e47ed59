"""Invoice life: finalize (the next gapless number of the year), void (which releases the usage for
billing again), reissue (void and bill again at once, on a new number) and credit notes that
correct finalized lines in full or in part. Every transition is a conditional UPDATE under a
row lock, recorded in the audit log; PostgreSQL refuses anything else (migrations 0002, 0003).

Void, reissue and credit notes change what a month's cap has left, so they take the billing lock
first (billing.billing_lock), then the invoice's row lock: a billing run sees them wholly or not."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.db import transaction
from django.db.models import Sum
from django.utils import timezone

from auditlog.services import actor_label, audit_record
from metering import fees
from metering.billing import billing_lock, invoice_rebill
from metering.errors import BillingError
from metering.models import (
    INVOICE_TRANSITIONS, CreditNote, CreditNoteLine, CreditReason, DocumentCounter, Invoice, InvoiceStatus, LineKind,
    Reissue,
)

INVOICE_SERIES = "INV"
CREDIT_SERIES = "CN"


def money(amount: Decimal | None, currency: str) -> str | None:
    """An amount as its currency writes it: 12.30 EUR is "12.30", 5 JPY is "5"."""
    if amount is None:
        return None
    return str(amount.quantize(fees.currency_quantum(currency)))


def plain(value: Decimal) -> str:
    """A quantity without trailing zeros or exponent: 40.000000 is "40", 0.050 is "0.05"."""
    return format(value.normalize(), "f")


def next_number(*, series: str, year: int) -> str:
    """The next number of a series and year, gapless: the counter row is locked FOR UPDATE and
    moves in the caller's transaction, so a rollback gives the number back."""
    DocumentCounter.objects.bulk_create([DocumentCounter(series=series, year=year, last=0)], ignore_conflicts=True)
    counter = DocumentCounter.objects.select_for_update().get(series=series, year=year)
    DocumentCounter.objects.filter(pk=counter.pk).update(last=counter.last + 1)
    return f"{series}-{year}-{counter.last + 1:06d}"


def _lock(invoice: Invoice, *, to: str) -> Invoice:
    locked = Invoice.objects.select_for_update().get(pk=invoice.pk)
    if to not in INVOICE_TRANSITIONS[locked.status]:
        raise BillingError("invalid_transition", f"invoice {locked} is {locked.status}; it cannot become {to} "
                                                 f"(draft -> finalized -> void).", status=409)
    return locked


def invoice_finalize(*, invoice: Invoice, actor: Any, now: datetime | None = None) -> Invoice:
    """Draft -> finalized, numbered INV-<year>-<n> in finalization order."""
    with transaction.atomic():
        locked = _lock(invoice, to=InvoiceStatus.FINALIZED)
        now = now or timezone.now()
        number = next_number(series=INVOICE_SERIES, year=now.year)
        changed = Invoice.objects.filter(pk=locked.pk, status=InvoiceStatus.DRAFT).update(
            status=InvoiceStatus.FINALIZED, number=number, finalized_at=now, finalized_by=actor_label(actor))
        if changed != 1:
            raise AssertionError(f"invoice {locked.pk} was locked as a draft but did not update")
        audit_record(action="invoice.finalized", actor=actor, organization_id=locked.organization_id,
                     target=f"invoice:{locked.pk}",
                     data={"number": number, "total": str(locked.total), "currency": locked.currency})
    invoice.refresh_from_db()
    return invoice


def invoice_void(*, invoice: Invoice, actor: Any, reason: str) -> Invoice:
    """Finalized -> void: the invoice is not owed; it keeps its number and lines so the series
    stays gapless and auditable, and its usage is released: the next billing run bills it again
    (or `invoice_reissue` does at once)."""
    reason = _void_reason(reason)
    with transaction.atomic():
        billing_lock()
        _void(_lock(invoice, to=InvoiceStatus.VOID), actor=actor, reason=reason)
    invoice.refresh_from_db()
    return invoice


def _void_reason(reason: str) -> str:
    reason = (reason or "").strip()
    if not reason:
        raise BillingError("missing_field", "say why the invoice is void (it is kept, with its reason, for audit).")
    return reason


def _void(locked: Invoice, *, actor: Any, reason: str) -> None:
    if locked.credit_notes.exists():
        raise BillingError("invoice_credited", f"invoice {locked} has credit notes; credit the rest instead of "
                                               "voiding it.", status=409)
    changed = Invoice.objects.filter(pk=locked.pk, status=InvoiceStatus.FINALIZED).update(
        status=InvoiceStatus.VOID, voided_at=timezone.now(), voided_by=actor_label(actor), void_reason=reason)
    if changed != 1:
        raise AssertionError(f"invoice {locked.pk} was locked as finalized but did not update")
    audit_record(action="invoice.voided", actor=actor, organization_id=locked.organization_id,
                 target=f"invoice:{locked.pk}", data={"number": locked.number, "reason": reason})


def invoice_reissue(*, invoice: Invoice, actor: Any, reason: str = "") -> Invoice:
    """Void a finalized invoice and bill its usage again at once, in one transaction: a corrective
    invoice of the same run, recomputed from the usage events with the caps as they now stand,
    finalized with the next number. A void invoice whose usage no invoice billed again yet is
    billed the same way (no reason needed). Returns the corrective invoice."""
    with transaction.atomic():
        billing_lock()
        locked = Invoice.objects.select_for_update().get(pk=invoice.pk)
        if locked.status == InvoiceStatus.FINALIZED:
            _void(locked, actor=actor, reason=_void_reason(reason))
            locked.refresh_from_db()
        elif locked.status == InvoiceStatus.DRAFT:
            raise BillingError("invalid_transition", f"invoice {locked} is a draft: nothing is owed on it yet; "
                                                     "finalize it, or correct the data before the next run.",
                               status=409)
        else:
            again = Reissue.objects.filter(voided=locked).select_related("invoice").first()
            if again is not None:
                raise BillingError("already_reissued", f"the usage of void invoice {locked} is billed again on "
                                                       f"invoice {again.invoice} already.", status=409)
        corrective = invoice_finalize(invoice=invoice_rebill(voided=locked, actor=actor), actor=actor)
        audit_record(action="invoice.reissued", actor=actor, organization_id=locked.organization_id,
                     target=f"invoice:{locked.pk}",
                     data={"voided": locked.number, "corrective": corrective.number, "total": str(corrective.total),
                           "voided_total": str(locked.total), "currency": locked.currency})
    return corrective


def credited_by_line(invoice: Invoice) -> dict[int, Decimal]:
    return {row["invoice_line_id"]: row["total"] for row in
            CreditNoteLine.objects.filter(invoice_line__invoice=invoice).values("invoice_line_id")
            .annotate(total=Sum("amount"))}


def invoice_balance(invoice: Invoice) -> Decimal:
    """What remains owed: the total less every credit (0 for a void invoice)."""
    if invoice.status == InvoiceStatus.VOID:
        return Decimal(0)
    return invoice.total - sum(credited_by_line(invoice).values(), Decimal(0))


def _credit_amounts(invoice: Invoice, lines: dict[int, Any], credited: dict[int, Decimal],
                    amounts: Mapping[Any, Any]) -> dict[int, Decimal]:
    plan: dict[int, Decimal] = {}
    for raw_id, raw_amount in amounts.items():
        try:
            line_id = int(raw_id)
            amount = fees.to_decimal(raw_amount, name=f"amount for line {raw_id}")
        except (TypeError, ValueError) as exc:
            raise BillingError("invalid_field", f"{exc}; send line id -> amount as a decimal string.") from None
        line = lines.get(line_id)
        if line is None:
            raise BillingError("not_found", f"line {raw_id} is not a line of invoice {invoice}.", status=404)
        if line.kind == LineKind.CAP:
            raise BillingError("invalid_field", "a cap line is only reversed by a full credit note.")
        if amount <= 0 or amount != fees.round_money(amount, currency=invoice.currency, rounding="down"):
            raise BillingError("invalid_field", f"the credit for line {line_id} is {amount}: a positive amount in "
                                                f"whole {invoice.currency} minor units.")
        before = credited.get(line_id, Decimal(0))
        if before + amount > line.fee:
            currency = invoice.currency
            raise BillingError("credit_exceeds_line", f"line {line_id} bills {money(line.fee, currency)} and "
                                                      f"{money(before, currency)} is credited already; at most "
                                                      f"{money(line.fee - before, currency)} more.")
        plan[line_id] = amount
    return plan


def credit_note_issue(*, invoice: Invoice, actor: Any, reason_code: str, memo: str = "",
                      amounts: Mapping[Any, Any] | None = None) -> CreditNote:
    """Credit a finalized invoice: in full (`amounts` None: every line's remaining amount, the cap
    line reversed too) or in part (`amounts`: line id -> amount). Never more than was invoiced."""
    if reason_code not in CreditReason.values:
        raise BillingError("invalid_field", f"reason_code {reason_code!r} is unknown; use one of "
                                            f"{', '.join(CreditReason.values)}.")
    with transaction.atomic():
        billing_lock()
        locked = Invoice.objects.select_for_update().get(pk=invoice.pk)
        if locked.status != InvoiceStatus.FINALIZED:
            raise BillingError("invalid_transition", f"invoice {locked} is {locked.status}; only finalized invoices "
                                                     "take credit notes.", status=409)
        lines = {line.pk: line for line in locked.lines.all()}
        credited = credited_by_line(locked)
        if amounts is None:
            plan = {pk: line.fee - credited.get(pk, Decimal(0)) for pk, line in lines.items()}
            plan = {pk: amount for pk, amount in plan.items() if amount != 0}
        else:
            plan = _credit_amounts(locked, lines, credited, amounts)
        total = sum(plan.values(), Decimal(0))
        already = sum(credited.values(), Decimal(0))
        if total <= 0:
            raise BillingError("nothing_to_credit", f"invoice {locked} has nothing left to credit.", status=409)
        if already + total > locked.total:
            currency = locked.currency
            raise BillingError("credit_exceeds_invoice", f"invoice {locked} totals {money(locked.total, currency)} and "
                                                         f"{money(already, currency)} is credited already; at most "
                                                         f"{money(locked.total - already, currency)} more.")
        now = timezone.now()
        note = CreditNote.objects.create(
            invoice=locked, organization_id=locked.organization_id,
            number=next_number(series=CREDIT_SERIES, year=now.year), reason_code=reason_code, memo=memo.strip(),
            full=amounts is None, currency=locked.currency, total=total, created_by=actor_label(actor))
        CreditNoteLine.objects.bulk_create([CreditNoteLine(credit_note=note, invoice_line_id=pk, amount=amount)
                                            for pk, amount in sorted(plan.items())])
        audit_record(action="invoice.credited", actor=actor, organization_id=locked.organization_id,
                     target=f"invoice:{locked.pk}",
                     data={"credit_note": note.number, "invoice": locked.number, "total": str(total),
                           "reason_code": reason_code, "lines": {str(k): str(v) for k, v in plan.items()}})
    return note
