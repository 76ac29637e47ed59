"""The upcoming invoice: what billing the open month would invoice if the month ended now, for one
organization or, for the platform's finance, for every one. Planned by the billing run's own code
(billing.plan_period), never stored.

The preview counts the usage received so far (the database's clock, no cutoff margin: nothing is
stored, so an insert still in flight can only be missing from the preview, never from the run).
The open month's run claims what the run before it did not: after the previous month's run that
is its own usage plus late usage of billed months (adjustment lines, capped by what those months
already billed); while the previous month is still unbilled, that month's run comes first and
takes every earlier event, so the preview shows the open month's usage alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.utils import timezone

from accounts.models import Organization
from metering.billing import PeriodPlan, PlannedInvoice, PlannedLine, Unbilled, _database_now, _describe, plan_period
from metering.errors import BillingError
from metering.invoices import money, plain
from metering.models import BillingRun, InvoiceLine, LineKind
from metering.periods import Period
from metering.selectors import BillingAccess

_DESCRIPTION_LENGTH = InvoiceLine._meta.get_field("description").max_length
_SIX_PLACES = Decimal("0.000001")  # hours, speedups, prices and shares as the invoice lines store them


@dataclass(frozen=True)
class PreviewLine:
    """One line as the invoice would show it. A cap line has no deployment or report."""

    position: int
    kind: str  # models.LineKind: usage, adjustment (late usage of a billed month) or cap
    usage_period: Period
    description: str
    deployment_id: str | None
    deployment: str
    hardware: str
    report_id: str | None
    report_sha256: str
    ci_low: Decimal | None
    speedup: Decimal  # S billed: the report's CI lower bound, or 1 when `reason` says why not
    hours: Decimal
    saved_hours: Decimal
    price_per_hour: Decimal
    share: Decimal
    savings: Decimal
    fee: Decimal
    reason: str


@dataclass(frozen=True)
class PreviewInvoice:
    organization_id: int
    organization: str  # slug
    currency: str
    lines: tuple[PreviewLine, ...]
    monthly_cap: Decimal | None  # the cap of the contract in force in the period; None: no cap
    cap_applied: Decimal  # the cap lines' sum: zero or negative
    total: Decimal

    @property
    def hours(self) -> Decimal:
        return sum((line.hours for line in self.lines), Decimal(0))

    def as_dict(self) -> dict[str, Any]:
        currency = self.currency
        return {
            "organization": self.organization, "currency": currency,
            "monthly_cap": money(self.monthly_cap, currency), "cap_applied": money(self.cap_applied, currency),
            "total": money(self.total, currency),
            "lines": [{
                "position": line.position, "kind": line.kind, "usage_period": line.usage_period.name,
                "description": line.description, "deployment": line.deployment_id,
                "deployment_name": line.deployment or None, "hardware": line.hardware or None,
                "report": line.report_id, "report_sha256": line.report_sha256 or None,
                "ci_low": None if line.ci_low is None else str(line.ci_low.quantize(_SIX_PLACES)),
                "speedup": str(line.speedup.quantize(_SIX_PLACES)), "hours": str(line.hours.quantize(_SIX_PLACES)),
                "saved_hours": plain(line.saved_hours),
                "price_per_hour": str(line.price_per_hour.quantize(_SIX_PLACES)),
                "share": str(line.share.quantize(_SIX_PLACES)), "savings": money(line.savings, currency),
                "fee": money(line.fee, currency), "reason": line.reason or None,
            } for line in self.lines],
        }


@dataclass(frozen=True)
class InvoicePreview:
    period: Period
    as_of: datetime  # usage received before this moment (the database's clock) is counted
    previous_run: Period | None  # the billed month this claim follows; None while that month is unbilled
    invoices: tuple[PreviewInvoice, ...]
    unbilled: tuple[Unbilled, ...]  # usage no contract prices: the run would list it, not invoice it

    def as_dict(self) -> dict[str, Any]:
        return {
            "period": self.period.name, "as_of": self.as_of.isoformat(),
            "previous_run": self.previous_run.name if self.previous_run else None,
            "invoices": [invoice.as_dict() for invoice in self.invoices],
            "unbilled": [{"deployment": u.deployment_id, "usage_period": u.usage_period.name,
                          "hours": str(u.hours), "reason": u.reason} for u in self.unbilled],
        }


def invoice_preview(*, organization: Organization, now: datetime | None = None) -> InvoicePreview:
    """What `organization` would be invoiced for the month of `now` (default: now) if it ended now."""
    return _preview(now=now, organization_ids=frozenset({organization.pk}))


def invoice_preview_all(*, access: BillingAccess, now: datetime | None = None) -> InvoicePreview:
    """The same for every organization: the platform's finance only."""
    if not access.operator:
        raise BillingError("forbidden", "The preview of every organization is for the billing operator's finance; "
                                        "a customer previews its own invoice.", status=403)
    return _preview(now=now, organization_ids=None)


def _preview(*, now: datetime | None, organization_ids: frozenset[int] | None) -> InvoicePreview:
    period = Period.of(now or timezone.now())
    as_of = _database_now()
    latest = BillingRun.objects.order_by("-period").first()
    if latest is not None and Period.of(latest.period) >= period:
        raise BillingError("period_billed", f"{period} is billed already (the last run billed "
                                            f"{Period.of(latest.period)}); read its invoices with GET "
                                            f"/api/v1/invoices?period={period}.", status=409)
    previous_run = Period.of(latest.period) if latest is not None else None
    previous = latest
    if previous_run != period.previous():
        # The previous month's run comes first (runs go in order) and claims every event before
        # `period` received by then; this unsaved stand-in claims what that run will.
        previous_run, previous = None, BillingRun(period=period.previous().first_day, cutoff=as_of)
    planned = plan_period(period=period, cutoff=as_of, previous=previous)

    def wanted(organization_id: int) -> bool:
        return organization_ids is None or organization_id in organization_ids

    chosen = [invoice for invoice in planned.plan.invoices if wanted(invoice.organization_id)]
    slugs = dict(Organization.objects.filter(pk__in={i.organization_id for i in chosen}).values_list("pk", "slug"))
    return InvoicePreview(
        period=period, as_of=as_of, previous_run=previous_run,
        invoices=tuple(_invoice(invoice, planned, period, slugs[invoice.organization_id]) for invoice in chosen),
        unbilled=tuple(u for u in planned.plan.unbilled
                       if wanted(planned.deployments[u.deployment_id].organization_id)))


def _invoice(invoice: PlannedInvoice, planned: PeriodPlan, period: Period, slug: str) -> PreviewInvoice:
    caps = [p.contract.terms.monthly_cap for p in invoice.lines if p.usage_period == period]
    return PreviewInvoice(
        organization_id=invoice.organization_id, organization=slug, currency=invoice.currency,
        lines=tuple(_line(position, p, planned, period) for position, p in enumerate(invoice.lines, start=1)),
        monthly_cap=caps[0] if caps else None,
        cap_applied=sum((p.line.fee for p in invoice.lines if p.kind == LineKind.CAP), Decimal(0)),
        total=invoice.total)


def _line(position: int, planned: PlannedLine, plan: PeriodPlan, period: Period) -> PreviewLine:
    line, group = planned.line, planned.group
    deployment = plan.deployments[group.deployment_id] if group is not None else None
    report = plan.reports[group.report_id] if group is not None else None
    return PreviewLine(
        position=position, kind=str(planned.kind), usage_period=planned.usage_period,
        description=_describe(planned, plan.deployments, plan.reports, period)[:_DESCRIPTION_LENGTH],
        deployment_id=deployment.id if deployment else None, deployment=deployment.name if deployment else "",
        hardware=deployment.hardware if deployment else "", report_id=report.id if report else None,
        report_sha256=report.sha256 if report else "", ci_low=report.ci_low if report else None,
        speedup=line.speedup, hours=line.hours, saved_hours=line.saved_hours, price_per_hour=line.price_per_hour,
        share=line.share, savings=line.savings, fee=line.fee, reason=line.reason.value if line.reason else "")
