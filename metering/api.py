"""The metering API under /api/v1/: contracts, deployments, usage batches, billing runs,
invoices, credit notes and exports. Thin: parse, check who may, call a service, serialize.

Scopes: customer keys write their own deployments and usage and read their own invoices; finance
keys of a customer read their own invoices; finance keys of the billing operator organization
(DYNO_BILLING_OPERATOR_ORG) manage contracts, run billing, finalize, void and credit for all.
"""

from __future__ import annotations

import functools
import uuid
from datetime import date, datetime
from typing import Any, Callable

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404

from accounts.models import Organization
from accounts.selectors import organization_for_actor
from api.auth import ApiError, api_endpoint, json_body
from api.bounded import InputRejected, day_bounded, moment_bounded
from api.pagination import page_response
from metering.billing import billing_run_create
from metering.contracts import contract_data, contract_terms_from, contract_version_create
from metering.deployments import deployment_create, deployment_data, deployment_switch_report
from metering.errors import BillingError
from metering.exports import FORMATS, export_filename, invoice_export, revenue_share_export
from metering.invoices import credit_note_issue, invoice_finalize, invoice_reissue, invoice_void
from metering.models import BillingRun, InvoiceStatus
from metering.periods import Period
from metering.preview import invoice_preview, invoice_preview_all
from metering.selectors import (
    BillingAccess, billing_access, contract_get, contract_list, deployment_get, deployment_list, invoice_get,
    invoice_list,
)
from metering.serializers import billing_run_dict, credit_note_dict, invoice_dict
from metering.usage import MAX_EVENTS, usage_ingest, usage_summary
from reports.models import Report

READERS = ("customer", "finance")


def _billing_errors(view: Callable) -> Callable:
    @functools.wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any):
        try:
            return view(request, *args, **kwargs)
        except BillingError as exc:
            raise ApiError(exc.status, exc.code, exc.message) from None

    return wrapper


def _operator(request: HttpRequest) -> BillingAccess:
    access = billing_access(request.actor)
    if not access.operator:
        raise ApiError(403, "forbidden", "This endpoint bills every organization: use a finance key of the billing "
                                         "operator's organization.")
    return access


def _uuid(value: Any, what: str) -> uuid.UUID:
    try:
        return uuid.UUID(str(value))
    except ValueError:
        raise ApiError(400, "invalid_id", f"{what} must be an id like 0f8c...; got {value!r}.") from None


def _date(value: Any, what: str) -> date:
    try:
        return day_bounded(value, what=what)
    except InputRejected as exc:
        raise ApiError(400, "invalid_field", exc.message) from None


def _moment(value: Any, what: str) -> datetime | None:
    """An optional time (absent: None), in UTC and inside the accepted window (api/bounded.py)."""
    if value is None or value == "":
        return None
    try:
        return moment_bounded(value, what=what)
    except InputRejected as exc:
        raise ApiError(400, "invalid_field", exc.message) from None


def _period(value: Any) -> Period:
    try:
        return Period.parse(str(value or ""))
    except ValueError as exc:
        raise ApiError(400, "invalid_period", str(exc)) from None


@api_endpoint(methods=("GET", "POST"), scopes=READERS)
@_billing_errors
def contracts(request: HttpRequest) -> JsonResponse:
    if request.method == "GET":
        access = billing_access(request.actor)
        organization = request.GET.get("organization")
        found = contract_list(access=access)
        if organization:
            found = found.filter(organization__slug=organization)
        return page_response(request, found, "contracts", contract_data)
    _operator(request)
    body = json_body(request)
    organization = get_object_or_404(Organization, slug=str(body.get("organization", "")))
    contract = contract_version_create(organization=organization, terms=contract_terms_from(body),
                                       effective_from=_date(body.get("effective_from"), "effective_from"),
                                       actor=request.actor)
    return JsonResponse(contract_data(contract), status=201)


@api_endpoint(methods=("GET",), scopes=READERS)
def contract_detail(request: HttpRequest, contract_id: uuid.UUID) -> JsonResponse:
    return JsonResponse(contract_data(contract_get(access=billing_access(request.actor), contract_id=contract_id)))


@api_endpoint(methods=("GET", "POST"), scopes=READERS)
@_billing_errors
def deployments(request: HttpRequest) -> JsonResponse:
    actor = request.actor
    if request.method == "GET":
        return page_response(request, deployment_list(access=billing_access(actor)), "deployments", deployment_data)
    body = json_body(request)
    organization = organization_for_actor(actor)
    report = get_object_or_404(Report, pk=_uuid(body.get("report"), "report"), organization=organization)
    deployment = deployment_create(actor=actor, organization=organization, report=report,
                                   name=str(body.get("name", "")),
                                   active_from=_moment(body.get("active_from"), "active_from"))
    return JsonResponse(deployment_data(deployment), status=201)


@api_endpoint(methods=("GET",), scopes=READERS)
def deployment_detail(request: HttpRequest, deployment_id: uuid.UUID) -> JsonResponse:
    deployment = deployment_get(access=billing_access(request.actor), deployment_id=deployment_id)
    return JsonResponse(deployment_data(deployment))


@api_endpoint(methods=("POST",), scopes=READERS)
@_billing_errors
def deployment_reports(request: HttpRequest, deployment_id: uuid.UUID) -> JsonResponse:
    """Correct which report a deployment bills under, by hand: the billing operator's finance only,
    with a reason. (A re-audit's report takes over by itself, when it is stored.)"""
    actor = request.actor
    deployment = deployment_get(access=billing_access(actor), deployment_id=deployment_id)
    _operator(request)
    body = json_body(request)
    reason = str(body.get("reason", "")).strip()
    if not reason:
        raise ApiError(400, "invalid_field", "Say why the deployment's report is corrected by hand (\"reason\"): "
                                             "it is kept in the audit log.")
    report = get_object_or_404(Report, pk=_uuid(body.get("report"), "report"),
                               organization_id=deployment.organization_id)
    deployment_switch_report(actor=actor, deployment=deployment, report=report,
                             effective_from=_moment(body.get("effective_from"), "effective_from"), reason=reason)
    return JsonResponse(deployment_data(deployment), status=201)


@api_endpoint(methods=("POST",), scopes=("customer",))
def usage_batch(request: HttpRequest) -> JsonResponse:
    body = json_body(request)
    events = body.get("events")
    if not isinstance(events, list) or not events:
        raise ApiError(400, "invalid_batch", "Send {\"events\": [{idempotency_key, deployment, timestamp, "
                                             "gpu_hours}, ...]} with 1 to 1000 events.")
    if len(events) > MAX_EVENTS:
        raise ApiError(400, "batch_too_large", f"A batch holds at most {MAX_EVENTS} events; this one has "
                                               f"{len(events)}. Split it.")
    results = usage_ingest(organization_id=request.actor.api_key.organization_id, events=events)
    return JsonResponse({**usage_summary(results), "results": [r.as_dict() for r in results]})


@api_endpoint(methods=("GET", "POST"), scopes=("finance",))
@_billing_errors
def billing_runs(request: HttpRequest) -> JsonResponse:
    _operator(request)
    if request.method == "GET":
        return page_response(request, BillingRun.objects.all(), "billing_runs", billing_run_dict)
    body = json_body(request)
    run, created = billing_run_create(period=_period(body.get("period")), actor=request.actor)
    return JsonResponse({**billing_run_dict(run), "created": created}, status=201 if created else 200)


@api_endpoint(methods=("GET",), scopes=("finance",))
def billing_run_detail(request: HttpRequest, run_id: uuid.UUID) -> JsonResponse:
    _operator(request)
    return JsonResponse(billing_run_dict(get_object_or_404(BillingRun, pk=run_id)))


@api_endpoint(methods=("GET",), scopes=READERS)
def invoices(request: HttpRequest) -> JsonResponse:
    status = request.GET.get("status", "")
    if status and status not in InvoiceStatus.values:
        raise ApiError(400, "invalid_filter", f"status is one of {', '.join(InvoiceStatus.values)}.")
    period = _period(request.GET["period"]).first_day if request.GET.get("period") else None
    found = invoice_list(access=billing_access(request.actor), status=status,
                         organization=request.GET.get("organization", ""), period=period,
                         currency=request.GET.get("currency", ""))
    return page_response(request, found, "invoices", invoice_dict)


@api_endpoint(methods=("GET",), scopes=READERS)
def invoice_detail(request: HttpRequest, invoice_id: uuid.UUID) -> JsonResponse:
    invoice = invoice_get(access=billing_access(request.actor), invoice_id=invoice_id)
    return JsonResponse(invoice_dict(invoice, with_lines=True))


@api_endpoint(methods=("POST",), scopes=("finance",))
@_billing_errors
def invoice_finalize_view(request: HttpRequest, invoice_id: uuid.UUID) -> JsonResponse:
    access = _operator(request)
    invoice = invoice_finalize(invoice=invoice_get(access=access, invoice_id=invoice_id), actor=request.actor)
    return JsonResponse(invoice_dict(invoice, with_lines=True))


@api_endpoint(methods=("POST",), scopes=("finance",))
@_billing_errors
def invoice_void_view(request: HttpRequest, invoice_id: uuid.UUID) -> JsonResponse:
    access = _operator(request)
    body = json_body(request)
    invoice = invoice_void(invoice=invoice_get(access=access, invoice_id=invoice_id), actor=request.actor,
                           reason=str(body.get("reason", "")))
    return JsonResponse(invoice_dict(invoice, with_lines=True))


@api_endpoint(methods=("POST",), scopes=("finance",))
@_billing_errors
def invoice_reissue_view(request: HttpRequest, invoice_id: uuid.UUID) -> JsonResponse:
    """Void a finalized invoice (or take a void one not yet billed again) and bill its usage at
    once on a corrective invoice with the next number; answers with the corrective invoice."""
    access = _operator(request)
    body = json_body(request)
    corrective = invoice_reissue(invoice=invoice_get(access=access, invoice_id=invoice_id), actor=request.actor,
                                 reason=str(body.get("reason", "")))
    return JsonResponse(invoice_dict(corrective, with_lines=True), status=201)


@api_endpoint(methods=("GET", "POST"), scopes=READERS)
@_billing_errors
def invoice_credit_notes(request: HttpRequest, invoice_id: uuid.UUID) -> JsonResponse:
    invoice = invoice_get(access=billing_access(request.actor), invoice_id=invoice_id)
    if request.method == "GET":
        return page_response(request, invoice.credit_notes.prefetch_related("lines"), "credit_notes",
                             credit_note_dict)
    _operator(request)
    body = json_body(request)
    lines = body.get("lines")
    if not body.get("full") and not isinstance(lines, dict):
        raise ApiError(400, "invalid_field", "Send {\"full\": true} or {\"lines\": {line id: amount}} with a "
                                             "reason_code.")
    note = credit_note_issue(invoice=invoice, actor=request.actor, reason_code=str(body.get("reason_code", "")),
                             memo=str(body.get("memo", "")), amounts=None if body.get("full") else lines)
    return JsonResponse(credit_note_dict(note), status=201)


def _download(content: bytes, fmt: str, filename: str) -> HttpResponse:
    response = HttpResponse(content, content_type=FORMATS[fmt])
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


@api_endpoint(methods=("GET",), scopes=READERS)
def invoice_export_view(request: HttpRequest, invoice_id: uuid.UUID) -> HttpResponse:
    fmt = request.GET.get("format", "csv")
    if fmt not in FORMATS:
        raise ApiError(400, "invalid_format", "format is csv, xlsx or pdf.")
    invoice = invoice_get(access=billing_access(request.actor), invoice_id=invoice_id)
    return _download(invoice_export(invoice, fmt), fmt, export_filename(invoice, fmt))


@api_endpoint(methods=("GET",), scopes=("finance",))
def revenue_share_view(request: HttpRequest) -> HttpResponse:
    _operator(request)
    fmt = request.GET.get("format", "csv")
    if fmt not in ("csv", "xlsx"):
        raise ApiError(400, "invalid_format", "format is csv or xlsx.")
    period = _period(request.GET.get("period"))
    return _download(revenue_share_export(period, fmt), fmt, f"revenue-share-{period}.{fmt}")


@api_endpoint(methods=("GET",), scopes=READERS)
@_billing_errors
def invoice_preview_view(request: HttpRequest) -> JsonResponse:
    """The open month's upcoming invoice, computed now and stored nowhere: a customer's keys see
    their own organization's, the billing operator's finance keys every organization's (or one,
    with ?organization=slug)."""
    access = billing_access(request.actor)
    slug = request.GET.get("organization", "").strip()
    if access.operator:
        preview = (invoice_preview(organization=get_object_or_404(Organization, slug=slug)) if slug
                   else invoice_preview_all(access=access))
    else:
        own = organization_for_actor(request.actor)
        if slug and slug != own.slug:
            raise ApiError(404, "not_found", f"No organization {slug[:60]!r} among those this key reads; leave out "
                                             "?organization to preview your own.")
        preview = invoice_preview(organization=own)
    return JsonResponse(preview.as_dict())
