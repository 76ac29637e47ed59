"""Reads of metering data, and who may read or bill what (`billing_access`).

Finance is two things. The platform operator's finance bills every customer organization: staff
users given the permission `metering.bill_customers` (superusers have it), members with role
`finance` of the operator organization (setting DYNO_BILLING_OPERATOR_ORG, a slug) and that
organization's API keys of scope `finance`. A customer organization's own people (owner, member,
finance) and keys (customer, finance) read its own invoices, deployments and contracts only;
auditors read reports, not money. Customers see invoices once finalized. Anything outside what an actor may read is a 404.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date

from django.conf import settings
from django.db.models import Q, QuerySet
from django.shortcuts import get_object_or_404

from accounts.models import Organization, Role, Scope
from accounts.selectors import Actor
from metering.models import BillingRun, Contract, Deployment, Invoice, InvoiceStatus

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


def invoice_list(*, access: BillingAccess, status: str = "", organization: str = "", period: date | None = None,
                 currency: str = "") -> QuerySet[Invoice]:
    """Invoices the actor may read, newest period first; empty filters are ignored."""
    invoices = _invoices(access)
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
