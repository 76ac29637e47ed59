"""Reads of metering data, and who may read or bill what (`billing_access`).

Finance is two things. The platform operator's finance bills every customer organization: staff
users given the permission `metering.bill_customers` (superusers have it), members with role
`finance` of the operator organization (setting DYNO_BILLING_OPERATOR_ORG, a slug) and that
organization's API keys of scope `finance`. A customer organization's own people (owner, member,
finance) and keys (customer, finance) read its own invoices, deployments and contracts only;
auditors read reports, not money. Customers see invoices once finalized. Anything outside what an actor may read is a 404.

Revenue has one definition, `revenue_lines`: the lines of finalized invoices, net of the credit
notes on them. The revenue dashboard, the revenue-share export and the invoice list's totals all
sum it, so they agree to the cent.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db.models import DecimalField, F, OuterRef, Q, QuerySet, Subquery, Sum, Value
from django.db.models.functions import Coalesce
from django.shortcuts import get_object_or_404

from accounts.models import Organization, Role, Scope
from accounts.selectors import Actor
from metering.models import (
    MONEY, BillingRun, Contract, CreditNote, CreditNoteLine, Deployment, Invoice, InvoiceLine, InvoiceStatus,
)

BILL_PERMISSION = "metering.bill_customers"
# Roles (web) and scopes (API keys) that read their own organization's billing.
READ_ROLES = frozenset({Role.OWNER, Role.MEMBER, Role.FINANCE, Scope.CUSTOMER, Scope.FINANCE})


@dataclass(frozen=True)
class BillingAccess:
    operator: bool  # the platform's finance: reads and bills every organization
    org_ids: frozenset[int]  # organizations whose own billing this actor reads
    label: str = "anonymous"

    def can_read(self, organization_id: int) -> bool:
        return self.operator or organization_id in self.org_ids

    def org_filter(self, field: str = "organization_id") -> Q:
        return Q() if self.operator else Q(**{f"{field}__in": self.org_ids})


def operator_organization_id() -> int | None:
    slug = getattr(settings, "DYNO_BILLING_OPERATOR_ORG", "")
    if not slug:
        return None
    return Organization.objects.filter(slug=slug).values_list("id", flat=True).first()


# The platform's own reads across every organization (finance exports).
EVERY_ORGANIZATION = BillingAccess(operator=True, org_ids=frozenset(), label="system:finance")


def billing_access(actor: Actor) -> BillingAccess:
    operator_org = operator_organization_id()
    if actor.api_key is not None:
        operator = actor.api_key.scope == Scope.FINANCE and actor.api_key.organization_id == operator_org
    elif actor.user is not None:
        user = actor.user
        operator = bool(user.is_active) and (
            user.has_perm(BILL_PERMISSION)
            or (operator_org is not None and actor.roles.get(operator_org) == Role.FINANCE)
        )
    else:
        operator = False
    readers = frozenset(org for org, role in actor.roles.items() if role in READ_ROLES)
    return BillingAccess(operator=operator, org_ids=readers, label=actor.audit_label)


def contract_list(*, access: BillingAccess, organization_id: int | None = None) -> QuerySet[Contract]:
    contracts = Contract.objects.select_related("organization").filter(access.org_filter())
    if organization_id is not None:
        contracts = contracts.filter(organization_id=organization_id)
    return contracts.order_by("organization__slug", "effective_from")


def contract_get(*, access: BillingAccess, contract_id) -> Contract:
    return get_object_or_404(Contract.objects.select_related("organization").filter(access.org_filter()),
                             pk=contract_id)


def contract_in_force(*, organization_id: int, day: date) -> Contract | None:
    """The version whose months cover `day`, or None."""
    return (Contract.objects.filter(organization_id=organization_id, effective_from__lte=day)
            .filter(Q(effective_to__isnull=True) | Q(effective_to__gt=day)).first())


def deployment_list(*, access: BillingAccess) -> QuerySet[Deployment]:
    return (Deployment.objects.select_related("organization", "model_version", "model_version__model")
            .filter(access.org_filter()).order_by("organization__slug", "name"))


def deployment_get(*, access: BillingAccess, deployment_id) -> Deployment:
    return get_object_or_404(deployment_list(access=access), pk=deployment_id)


def deployment_history(*, deployment: Deployment) -> list:
    return list(deployment.report_history.select_related("report").order_by("effective_from"))


def _invoices(access: BillingAccess) -> QuerySet[Invoice]:
    invoices = Invoice.objects.select_related("organization", "run").filter(access.org_filter())
    # Drafts are finance's work in progress; a customer sees an invoice once it is finalized.
    return invoices if access.operator else invoices.exclude(status=InvoiceStatus.DRAFT)


def _money_or_zero(subquery: QuerySet) -> Coalesce:
    return Coalesce(Subquery(subquery), Value(Decimal(0)), output_field=DecimalField(**MONEY))


def _credited_invoice() -> Coalesce:
    return _money_or_zero(CreditNote.objects.filter(invoice=OuterRef("pk")).order_by()
                          .values("invoice").annotate(total=Sum("total")).values("total"))


def _credited_line() -> Coalesce:
    return _money_or_zero(CreditNoteLine.objects.filter(invoice_line=OuterRef("pk")).order_by()
                          .values("invoice_line").annotate(total=Sum("amount")).values("total"))


def revenue_lines(*, access: BillingAccess, period: date | None = None, organization: str = "",
                  currency: str = "") -> QuerySet[InvoiceLine]:
    """The lines that are revenue: every line of a finalized invoice (a draft is not owed yet, a
    void invoice never is), with `credited` (what credit notes took off it) and `net`."""
    lines = InvoiceLine.objects.filter(access.org_filter("invoice__organization_id"),
                                       invoice__status=InvoiceStatus.FINALIZED)
    if period is not None:
        lines = lines.filter(invoice__period=period)
    if organization:
        lines = lines.filter(invoice__organization__slug=organization)
    if currency:
        lines = lines.filter(invoice__currency=currency.upper())
    return lines.annotate(credited=_credited_line()).annotate(net=F("fee") - F("credited"))


def revenue_totals(lines: QuerySet[InvoiceLine], *by: str) -> list[dict[str, Any]]:
    """`invoiced` (line fees, cap lines included), `credited` and `net` of revenue lines, per value
    of the fields `by` (always with the currency: amounts of two currencies never add)."""
    fields = (*by, "invoice__currency") if "invoice__currency" not in by else by
    rows = list(lines.values(*fields).annotate(invoiced=Sum("fee"), credited_sum=Sum("credited"))
                .order_by(*fields))
    for row in rows:
        row["currency"] = row["invoice__currency"]
        row["credited"] = row.pop("credited_sum")
        row["net"] = row["invoiced"] - row["credited"]
    return rows


def invoice_list(*, access: BillingAccess, status: str = "", organization: str = "", period: date | None = None,
                 currency: str = "") -> QuerySet[Invoice]:
    """Invoices the actor may read, newest period first, each with `credited` (its credit notes)
    and `net` (the total less them: revenue once finalized); empty filters are ignored."""
    invoices = _invoices(access).annotate(credited=_credited_invoice()).annotate(net=F("total") - F("credited"))
    if status:
        invoices = invoices.filter(status=status)
    if organization:
        invoices = invoices.filter(organization__slug=organization)
    if period is not None:
        invoices = invoices.filter(period=period)
    if currency:
        invoices = invoices.filter(currency=currency.upper())
    return invoices.order_by("-period", "organization__slug", "currency")


def invoice_get(*, access: BillingAccess, invoice_id) -> Invoice:
    return get_object_or_404(_invoices(access), pk=invoice_id)


def invoice_lines(*, invoice: Invoice) -> list:
    return list(invoice.lines.select_related("record", "record__deployment", "record__report",
                                             "record__contract").order_by("position"))


def run_list() -> QuerySet[BillingRun]:
    return BillingRun.objects.order_by("-period")
