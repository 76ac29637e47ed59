"""Billing pages: invoices (list, detail, finalize, void, credit notes, downloads), billing runs,
contracts, the revenue dashboard for finance and the savings dashboard for customers."""

from __future__ import annotations

from datetime import date
from decimal import Decimal
from typing import Any

import plotly
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from accounts.models import Organization
from accounts.selectors import actor_for_user
from api.pagination import html_page
from metering.billing import billing_run_create
from metering.charts import revenue_by_customer, revenue_by_hardware, revenue_by_month, savings_by_month
from metering.contracts import TERMS_FIELDS, contract_terms_from, contract_version_create
from metering.errors import BillingError
from metering.exports import FORMATS, export_filename, invoice_export, revenue_share_export
from metering.invoices import (
    credit_note_issue,
    credited_by_line,
    invoice_balance,
    invoice_finalize,
    invoice_reissue,
    invoice_void,
)
from metering.models import BillingRun, CreditReason, InvoiceStatus
from metering.periods import Period
from metering.preview import invoice_preview, invoice_preview_all
from metering.selectors import (
    BillingAccess, billing_access, contract_list, deployment_list, invoice_get, invoice_lines, invoice_list,
    revenue_lines, revenue_totals,
)

# plotly.js is served locally by the reports app (reports:plotly-js), versioned by the package.
PLOTLY_VERSION = plotly.__version__


def _access(request: HttpRequest) -> BillingAccess:
    return billing_access(actor_for_user(request.user))


def _operator(request: HttpRequest) -> BillingAccess:
    access = _access(request)
    if not access.operator:
        raise PermissionDenied("Billing every organization is for the platform's finance staff.")
    return access


def _actor(request: HttpRequest):
    return actor_for_user(request.user)


@login_required
def invoices(request: HttpRequest) -> HttpResponse:
    access = _access(request)
    filters = {key: request.GET.get(key, "").strip() for key in ("status", "organization", "period", "currency")}
    try:
        period = Period.parse(filters["period"]).first_day if filters["period"] else None
    except ValueError as exc:
        messages.error(request, str(exc))
        period = None
    status = filters["status"] if filters["status"] in InvoiceStatus.values else ""
    found = invoice_list(access=access, status=status, organization=filters["organization"], period=period,
                         currency=filters["currency"])
    # The same revenue as the dashboard and the export: finalized invoices, net of credit notes.
    revenue = [] if status not in ("", InvoiceStatus.FINALIZED) else revenue_totals(revenue_lines(
        access=access, period=period, organization=filters["organization"], currency=filters["currency"]))
    pager = html_page(request, found)
    return render(request, "metering/invoices.html", {
        "invoices": pager.rows, "pager": pager, "filters": filters, "statuses": InvoiceStatus.values, "operator": access.operator,
        "revenue": revenue,
        "organizations": Organization.objects.order_by("slug") if access.operator else [],
        **_preview_section(access, every_organization=False),
    })


@login_required
def invoice_detail(request: HttpRequest, invoice_id) -> HttpResponse:
    access = _access(request)
    invoice = invoice_get(access=access, invoice_id=invoice_id)
    credited = credited_by_line(invoice)
    lines = invoice_lines(invoice=invoice)
    return render(request, "metering/invoice_detail.html", {
        "invoice": invoice, "lines": [(line, credited.get(line.pk, Decimal(0))) for line in lines],
        "credit_notes": invoice.credit_notes.prefetch_related("lines").order_by("created_at"),
        "balance": invoice_balance(invoice), "operator": access.operator, "reasons": CreditReason.choices,
        "period": Period.of(invoice.period), "formats": list(FORMATS),
    })


def _invoice_action(request: HttpRequest, invoice_id, action) -> HttpResponse:
    access = _operator(request)
    invoice = invoice_get(access=access, invoice_id=invoice_id)
    try:
        message = action(invoice)
    except BillingError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, message)
    return redirect("metering:invoice", invoice_id=invoice.pk)


@login_required
@require_POST
def invoice_finalize_view(request: HttpRequest, invoice_id) -> HttpResponse:
    def finalize(invoice):
        done = invoice_finalize(invoice=invoice, actor=_actor(request))
        return f"Invoice finalized as {done.number}."

    return _invoice_action(request, invoice_id, finalize)


@login_required
@require_POST
def invoice_void_view(request: HttpRequest, invoice_id) -> HttpResponse:
    def void(invoice):
        invoice_void(invoice=invoice, actor=_actor(request), reason=request.POST.get("reason", ""))
        return f"Invoice {invoice.number} is void; its usage is billed again by the next billing run (or reissue it now)."

    return _invoice_action(request, invoice_id, void)


@login_required
@require_POST
def invoice_reissue_view(request: HttpRequest, invoice_id) -> HttpResponse:
    def reissue(invoice):
        corrective = invoice_reissue(invoice=invoice, actor=_actor(request), reason=request.POST.get("reason", ""))
        return f"Invoice {invoice.number} is void; its usage is billed on {corrective.number}."

    return _invoice_action(request, invoice_id, reissue)


@login_required
@require_POST
def invoice_credit_view(request: HttpRequest, invoice_id) -> HttpResponse:
    def credit(invoice):
        amounts = None
        if request.POST.get("full") != "1":
            amounts = {key.removeprefix("line-"): value.strip() for key, value in request.POST.items()
                       if key.startswith("line-") and value.strip()}
            if not amounts:
                raise BillingError("missing_field", "enter an amount for at least one line, or credit in full.")
        note = credit_note_issue(invoice=invoice, actor=_actor(request), reason_code=request.POST.get("reason_code", ""),
                                 memo=request.POST.get("memo", ""), amounts=amounts)
        return f"Credit note {note.number} issued for {note.total} {note.currency}."

    return _invoice_action(request, invoice_id, credit)


def _download(content: bytes, fmt: str, filename: str) -> HttpResponse:
    response = HttpResponse(content, content_type=FORMATS[fmt])
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


@login_required
def invoice_download(request: HttpRequest, invoice_id, fmt: str) -> HttpResponse:
    if fmt not in FORMATS:
        raise Http404("No such format.")
    invoice = invoice_get(access=_access(request), invoice_id=invoice_id)
    return _download(invoice_export(invoice, fmt), fmt, export_filename(invoice, fmt))


@login_required
@require_http_methods(["GET", "POST"])
def runs(request: HttpRequest) -> HttpResponse:
    _operator(request)
    suggested = Period.of(date.today()).previous()
    if request.method == "POST":
        try:
            period = Period.parse(request.POST.get("period", ""))
            run, created = billing_run_create(period=period, actor=_actor(request))
        except (BillingError, ValueError) as exc:
            messages.error(request, str(exc))
        else:
            if created:
                messages.success(request, f"Billed {period}: {run.summary.get('invoices', 0)} draft invoices.")
            else:
                messages.info(request, f"{period} was billed already; nothing changed.")
            return redirect("metering:run", run_id=run.pk)
    return render(request, "metering/runs.html", {"runs": BillingRun.objects.order_by("-period")[:60],
                                                  "suggested": suggested,
                                                  **_preview_section(_access(request), every_organization=True)})


@login_required
def run_detail(request: HttpRequest, run_id) -> HttpResponse:
    access = _operator(request)
    run = get_object_or_404(BillingRun, pk=run_id)
    return render(request, "metering/run_detail.html", {
        "run": run, "period": Period.of(run.period),
        "invoices": invoice_list(access=access).filter(run=run)})


@login_required
@require_http_methods(["GET", "POST"])
def contracts(request: HttpRequest) -> HttpResponse:
    access = _access(request)
    if request.method == "POST":
        _operator(request)
        data = {key: request.POST.get(key, "").strip() for key in TERMS_FIELDS}
        data["prices"] = {hw.strip(): price.strip() for hw, _, price in
                          (item.partition("=") for item in request.POST.get("prices", "").split(",") if item.strip())}
        try:
            organization = Organization.objects.get(slug=request.POST.get("organization", ""))
            contract = contract_version_create(organization=organization, terms=contract_terms_from(data),
                                               effective_from=date.fromisoformat(request.POST.get("effective_from", "")),
                                               actor=_actor(request))
        except Organization.DoesNotExist:
            messages.error(request, "No such organization.")
        except ValueError as exc:  # BillingError is a ValueError; so are bad dates
            messages.error(request, str(exc))
        else:
            messages.success(request, f"Contract version {contract.version} of {organization.slug} starts "
                                      f"{contract.effective_from}.")
            return redirect("metering:contracts")
    return render(request, "metering/contracts.html", {
        "contracts": contract_list(access=access), "operator": access.operator,
        "organizations": Organization.objects.order_by("slug") if access.operator else [],
        "next_month": Period.of(date.today()).next().first_day, "post": request.POST,
    })


@login_required
def revenue(request: HttpRequest) -> HttpResponse:
    access = _operator(request)
    by_month, month_table = revenue_by_month(access)
    by_customer, customer_table = revenue_by_customer(access)
    by_hardware, hardware_table = revenue_by_hardware(access)
    periods = [Period.of(p) for p in BillingRun.objects.order_by("-period").values_list("period", flat=True)[:24]]
    return render(request, "metering/revenue.html", {
        "charts": [by_month, by_customer, by_hardware], "month_table": month_table, "plotly_version": PLOTLY_VERSION,
        "customer_table": customer_table, "hardware_table": hardware_table, "periods": periods,
    })


@login_required
def revenue_share_download(request: HttpRequest, fmt: str) -> HttpResponse:
    _operator(request)
    if fmt not in ("csv", "xlsx"):
        raise Http404("No such format.")
    try:
        period = Period.parse(request.GET.get("period", ""))
    except ValueError as exc:
        messages.error(request, str(exc))
        return redirect("metering:revenue")
    return _download(revenue_share_export(period, fmt), fmt, f"revenue-share-{period}.{fmt}")


@login_required
def savings(request: HttpRequest) -> HttpResponse:
    access = _access(request)
    charts, table = savings_by_month(access.org_ids)
    return render(request, "metering/savings.html", {"charts": charts, "table": table,
                                                     "plotly_version": PLOTLY_VERSION})


@login_required
def deployments(request: HttpRequest) -> HttpResponse:
    found = deployment_list(access=_access(request)).prefetch_related("report_history__report")
    return render(request, "metering/deployments.html", {"deployments": found})


def _preview_section(access: BillingAccess, *, every_organization: bool) -> dict[str, Any]:
    """The upcoming-invoice table of a billing page: every organization's on finance's billing runs
    page, the reader's own on a customer's invoices page (finance reads it on the runs page)."""
    try:
        if every_organization:
            previews = [invoice_preview_all(access=access)]
        elif access.operator:
            previews = []
        else:
            previews = [invoice_preview(organization=organization)
                        for organization in Organization.objects.filter(pk__in=access.org_ids).order_by("slug")]
    except BillingError as exc:
        return {"previews": [], "preview_error": exc.message}
    return {"previews": previews, "preview_error": ""}
