"""The metering API under /api/v1/: contracts, deployments, usage batches, billing runs,
invoices, credit notes and exports. Thin: parse, check who may, call a service, serialize; the
shapes are metering/schemas.py, the routes' declarations (who, what answers) api/routes.route.

Scopes: customer keys write their own deployments and usage and read their own invoices; finance
keys of a customer read their own invoices; finance keys of the billing operator organization
(DYNO_BILLING_OPERATOR_ORG) manage contracts, run billing, finalize, void and credit for all.
"""

from __future__ import annotations

import functools
import uuid
from datetime import date, datetime
from typing import Any, Callable

from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404
from ninja import Body, Query, Router, Status

from accounts.models import Organization
from accounts.selectors import organization_for_actor
from api.auth import ApiError
from api.bounded import InputRejected, day_bounded, id_bounded, moment_bounded
from api.pagination import page_body
from api.routes import CUSTOMER, FINANCE, route
from api.schemas import PageQuery
from metering import schemas
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

router = Router(tags=["metering"])

READERS = CUSTOMER + FINANCE
FINANCE_ONLY = " Finance keys of the billing operator's organization only."


def _download_doc(what: str, formats: tuple[str, ...]) -> dict[str, Any]:
    """The 200 of a download: the file in each format's own content type (not JSON)."""
    return {"responses": {200: {
        "description": f"{what} (Content-Disposition: attachment)",
        "content": {FORMATS[fmt].split(";")[0]: {"schema": {"type": "string", "format": "binary"}}
                    for fmt in formats}}}}


# A JSON body parameter defaults to None (`Body(None)`): a request without a body reads as {}, as
# json_body always read it, so the view's own checks answer it rather than a missing_field for the
# whole body. REQUIRED_BODY documents the body as required where its model has fields to send.
REQUIRED_BODY = {"requestBody": {"required": True}}


def _billing_errors(view: Callable) -> Callable:
    """A service's refusal (BillingError) as the API's error, with its status and code."""

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


# -- contracts ------------------------------------------------------------------------------------

@route(router, "GET", "/contracts", name="contracts", scopes=READERS,
       summary="Contract versions you may read (a customer: its own), newest first",
       ok={200: schemas.ContractPage}, errors=(400,))
@_billing_errors
def contracts_list(request: HttpRequest, page: Query[PageQuery], query: Query[schemas.OrganizationQuery]):
    found = contract_list(access=billing_access(request.actor))
    if query.organization:
        found = found.filter(organization__slug=query.organization)
    return page_body(request, found, "contracts", contract_data)


@route(router, "POST", "/contracts", name="contracts", scopes=READERS,
       summary="Add a contract version from the first day of a month." + FINANCE_ONLY,
       ok={201: schemas.Contract}, errors=(400, 404, 409, 413), openapi_extra=REQUIRED_BODY)
@_billing_errors
def contract_create(request: HttpRequest, body: schemas.ContractRequest = Body(None)):
    body = body or schemas.ContractRequest()
    _operator(request)
    organization = get_object_or_404(Organization, slug=body.organization or "")
    terms = contract_terms_from(body.model_dump(exclude_unset=True))  # the terms as sent: the rules judge them
    contract = contract_version_create(organization=organization, terms=terms,
                                       effective_from=_date(body.effective_from, "effective_from"),
                                       actor=request.actor)
    return Status(201, contract_data(contract))


@route(router, "GET", "/contracts/{uuid:contract_id}", name="contract-detail", scopes=READERS,
       summary="One contract version", ok={200: schemas.Contract}, errors=(404,))
def contract_detail(request: HttpRequest, contract_id: uuid.UUID):
    return contract_data(contract_get(access=billing_access(request.actor), contract_id=contract_id))


# -- deployments ----------------------------------------------------------------------------------

@route(router, "GET", "/deployments", name="deployments", scopes=READERS,
       summary="Your deployments with their report history, newest first",
       ok={200: schemas.DeploymentPage}, errors=(400,))
@_billing_errors
def deployments_list(request: HttpRequest, page: Query[PageQuery]):
    return page_body(request, deployment_list(access=billing_access(request.actor)), "deployments", deployment_data)


@route(router, "POST", "/deployments", name="deployments", scopes=READERS,
       summary="Deploy the artifact a signed report measured (customer keys)",
       ok={201: schemas.Deployment}, errors=(400, 404, 409, 413), openapi_extra=REQUIRED_BODY)
@_billing_errors
def deployment_create_view(request: HttpRequest, body: schemas.DeploymentRequest = Body(None)):
    body = body or schemas.DeploymentRequest()
    actor = request.actor
    organization = organization_for_actor(actor)
    report = get_object_or_404(Report, pk=id_bounded(body.report, what="report"), organization=organization)
    deployment = deployment_create(actor=actor, organization=organization, report=report, name=body.name or "",
                                   active_from=_moment(body.active_from, "active_from"))
    return Status(201, deployment_data(deployment))


@route(router, "GET", "/deployments/{uuid:deployment_id}", name="deployment-detail", scopes=READERS,
       summary="A deployment", ok={200: schemas.Deployment}, errors=(404,))
def deployment_detail(request: HttpRequest, deployment_id: uuid.UUID):
    return deployment_data(deployment_get(access=billing_access(request.actor), deployment_id=deployment_id))


@route(router, "POST", "/deployments/{uuid:deployment_id}/reports", name="deployment-reports", scopes=READERS,
       summary="Correct a deployment's report by hand (billing operator's finance key only, with a reason; a "
               "re-audit's report takes over by itself). Same artifact, stable, on the contract's plan; never "
               "inside a billed month",
       ok={201: schemas.Deployment}, errors=(400, 404, 409, 413), openapi_extra=REQUIRED_BODY)
@_billing_errors
def deployment_reports(request: HttpRequest, deployment_id: uuid.UUID,
                       body: schemas.DeploymentReportRequest = Body(None)):
    """Correct which report a deployment bills under, by hand: the billing operator's finance only,
    with a reason. (A re-audit's report takes over by itself, when it is stored.)"""
    body = body or schemas.DeploymentReportRequest()
    actor = request.actor
    deployment = deployment_get(access=billing_access(actor), deployment_id=deployment_id)
    _operator(request)
    reason = (body.reason or "").strip()
    if not reason:
        raise ApiError(400, "invalid_field", "Say why the deployment's report is corrected by hand (\"reason\"): "
                                             "it is kept in the audit log.")
    report = get_object_or_404(Report, pk=id_bounded(body.report, what="report"), organization_id=deployment.organization_id)
    deployment_switch_report(actor=actor, deployment=deployment, report=report,
                             effective_from=_moment(body.effective_from, "effective_from"), reason=reason)
    return Status(201, deployment_data(deployment))


# -- usage ----------------------------------------------------------------------------------------

@route(router, "POST", "/usage/batch", name="usage-batch", scopes=CUSTOMER,
       summary="Report up to 1,000 usage events; each gets created, duplicate or rejected with a reason",
       ok={200: schemas.UsageBatchResult}, errors=(400, 413), openapi_extra=REQUIRED_BODY)
def usage_batch(request: HttpRequest, body: schemas.UsageBatch = Body(None)):
    body = body or schemas.UsageBatch()
    events = body.events
    if not isinstance(events, list) or not events:
        raise ApiError(400, "invalid_batch", "Send {\"events\": [{idempotency_key, deployment, timestamp, "
                                             "gpu_hours}, ...]} with 1 to 1000 events.")
    if len(events) > MAX_EVENTS:
        raise ApiError(400, "batch_too_large", f"A batch holds at most {MAX_EVENTS} events; this one has "
                                               f"{len(events)}. Split it.")
    results = usage_ingest(organization_id=request.actor.api_key.organization_id, events=events)
    return {**usage_summary(results), "results": [r.as_dict() for r in results]}


# -- billing runs ---------------------------------------------------------------------------------

@route(router, "GET", "/billing-runs", name="billing-runs", scopes=FINANCE,
       summary="Billing runs, newest first." + FINANCE_ONLY, ok={200: schemas.BillingRunPage}, errors=(400,))
@_billing_errors
def billing_runs_list(request: HttpRequest, page: Query[PageQuery]):
    _operator(request)
    return page_body(request, BillingRun.objects.all(), "billing_runs", billing_run_dict)


@route(router, "POST", "/billing-runs", name="billing-runs", scopes=FINANCE,
       summary="Bill a month once (a rerun returns the existing run, 200)." + FINANCE_ONLY,
       ok={201: schemas.BillingRunCreated, 200: schemas.BillingRunCreated}, errors=(400, 409, 413),
       openapi_extra=REQUIRED_BODY)
@_billing_errors
def billing_run_create_view(request: HttpRequest, body: schemas.BillingRunRequest = Body(None)):
    body = body or schemas.BillingRunRequest()
    _operator(request)
    run, created = billing_run_create(period=_period(body.period), actor=request.actor)
    return Status(201 if created else 200, {**billing_run_dict(run), "created": created})


@route(router, "GET", "/billing-runs/{uuid:run_id}", name="billing-run-detail", scopes=FINANCE,
       summary="A billing run." + FINANCE_ONLY, ok={200: schemas.BillingRun}, errors=(404,))
def billing_run_detail(request: HttpRequest, run_id: uuid.UUID):
    _operator(request)
    return billing_run_dict(get_object_or_404(BillingRun, pk=run_id))


# -- invoices -------------------------------------------------------------------------------------

@route(router, "GET", "/invoices", name="invoices", scopes=READERS,
       summary="Invoices you may read (a customer: its own, once finalized), newest first",
       ok={200: schemas.InvoicePage}, errors=(400,))
def invoices_list(request: HttpRequest, page: Query[PageQuery], query: Query[schemas.InvoiceQuery]):
    # Checked here, not by the parameters' types: the codes stay invalid_filter and invalid_period.
    if query.status and query.status not in InvoiceStatus.values:
        raise ApiError(400, "invalid_filter", f"status is one of {', '.join(InvoiceStatus.values)}.")
    period = _period(query.period).first_day if query.period else None
    found = invoice_list(access=billing_access(request.actor), status=query.status,
                         organization=query.organization, period=period, currency=query.currency)
    return page_body(request, found, "invoices", invoice_dict)


@route(router, "GET", "/invoices/preview", name="invoice-preview", scopes=READERS,
       summary="What the open month would be invoiced if it ended now, by the billing run's own rules (lines with "
               "the speedup S used, hours and fee; the cap; the total). Stores nothing. A customer's key sees its "
               "own organization; the billing operator's finance keys see every organization, or one with "
               "?organization",
       ok={200: schemas.InvoicePreview}, errors=(404, 409))
@_billing_errors
def invoice_preview_view(request: HttpRequest, query: Query[schemas.OrganizationQuery]):
    """The open month's upcoming invoice, computed now and stored nowhere: a customer's keys see
    their own organization's, the billing operator's finance keys every organization's (or one,
    with ?organization=slug)."""
    access = billing_access(request.actor)
    slug = query.organization.strip()
    if access.operator:
        preview = (invoice_preview(organization=get_object_or_404(Organization, slug=slug)) if slug
                   else invoice_preview_all(access=access))
    else:
        own = organization_for_actor(request.actor)
        if slug and slug != own.slug:
            raise ApiError(404, "not_found", f"No organization {slug[:60]!r} among those this key reads; leave out "
                                             "?organization to preview your own.")
        preview = invoice_preview(organization=own)
    return preview.as_dict()


@route(router, "GET", "/invoices/{uuid:invoice_id}", name="invoice-detail", scopes=READERS,
       summary="An invoice with its lines, billing records and credit notes",
       ok={200: schemas.Invoice}, errors=(404,))
def invoice_detail(request: HttpRequest, invoice_id: uuid.UUID):
    invoice = invoice_get(access=billing_access(request.actor), invoice_id=invoice_id)
    return invoice_dict(invoice, with_lines=True)


@route(router, "POST", "/invoices/{uuid:invoice_id}/finalize", name="invoice-finalize", scopes=FINANCE,
       summary="Draft -> finalized, with the next gapless number of the year." + FINANCE_ONLY,
       ok={200: schemas.Invoice}, errors=(404, 409))
@_billing_errors
def invoice_finalize_view(request: HttpRequest, invoice_id: uuid.UUID):
    access = _operator(request)
    invoice = invoice_finalize(invoice=invoice_get(access=access, invoice_id=invoice_id), actor=request.actor)
    return invoice_dict(invoice, with_lines=True)


@route(router, "POST", "/invoices/{uuid:invoice_id}/void", name="invoice-void", scopes=FINANCE,
       summary="Finalized -> void, with a reason." + FINANCE_ONLY,
       ok={200: schemas.Invoice}, errors=(400, 404, 409, 413), openapi_extra=REQUIRED_BODY)
@_billing_errors
def invoice_void_view(request: HttpRequest, invoice_id: uuid.UUID, body: schemas.VoidRequest = Body(None)):
    body = body or schemas.VoidRequest()
    access = _operator(request)
    invoice = invoice_void(invoice=invoice_get(access=access, invoice_id=invoice_id), actor=request.actor,
                           reason=body.reason or "")
    return invoice_dict(invoice, with_lines=True)


@route(router, "POST", "/invoices/{uuid:invoice_id}/reissue", name="invoice-reissue", scopes=FINANCE,
       summary="Void a finalized invoice (reason required) or take a void one whose usage is not billed again "
               "yet, and bill that usage at once on a corrective invoice with the next number." + FINANCE_ONLY,
       ok={201: schemas.Invoice}, errors=(400, 404, 409, 413))
@_billing_errors
def invoice_reissue_view(request: HttpRequest, invoice_id: uuid.UUID,
                         body: schemas.ReissueRequest = Body(None)):
    """Void a finalized invoice (or take a void one not yet billed again) and bill its usage at
    once on a corrective invoice with the next number; answers with the corrective invoice."""
    body = body or schemas.ReissueRequest()
    access = _operator(request)
    corrective = invoice_reissue(invoice=invoice_get(access=access, invoice_id=invoice_id), actor=request.actor,
                                 reason=body.reason or "")
    return Status(201, invoice_dict(corrective, with_lines=True))


@route(router, "GET", "/invoices/{uuid:invoice_id}/credit-notes", name="invoice-credit-notes", scopes=READERS,
       summary="Credit notes of an invoice, newest first", ok={200: schemas.CreditNotePage}, errors=(400, 404))
@_billing_errors
def credit_notes_list(request: HttpRequest, invoice_id: uuid.UUID, page: Query[PageQuery]):
    invoice = invoice_get(access=billing_access(request.actor), invoice_id=invoice_id)
    return page_body(request, invoice.credit_notes.prefetch_related("lines"), "credit_notes", credit_note_dict)


@route(router, "POST", "/invoices/{uuid:invoice_id}/credit-notes", name="invoice-credit-notes", scopes=READERS,
       summary="Credit a finalized invoice in full or per line." + FINANCE_ONLY,
       ok={201: schemas.CreditNote}, errors=(400, 404, 409, 413), openapi_extra=REQUIRED_BODY)
@_billing_errors
def credit_note_create(request: HttpRequest, invoice_id: uuid.UUID,
                       body: schemas.CreditNoteRequest = Body(None)):
    body = body or schemas.CreditNoteRequest()
    invoice = invoice_get(access=billing_access(request.actor), invoice_id=invoice_id)
    _operator(request)
    if not body.full and not isinstance(body.lines, dict):
        raise ApiError(400, "invalid_field", "Send {\"full\": true} or {\"lines\": {line id: amount}} with a "
                                             "reason_code.")
    reason_code = "" if body.reason_code is None else str(body.reason_code)  # the service names the codes
    note = credit_note_issue(invoice=invoice, actor=request.actor, reason_code=reason_code,
                             memo=body.memo or "", amounts=None if body.full else body.lines)
    return Status(201, credit_note_dict(note))


# -- exports --------------------------------------------------------------------------------------

def _download(content: bytes, fmt: str, filename: str) -> HttpResponse:
    response = HttpResponse(content, content_type=FORMATS[fmt])
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


@route(router, "GET", "/invoices/{uuid:invoice_id}/export", name="invoice-export", scopes=READERS,
       summary="The invoice as CSV, XLSX or PDF", ok={200: None}, errors=(400, 404),
       openapi_extra=_download_doc("the invoice", ("csv", "xlsx", "pdf")))
def invoice_export_view(request: HttpRequest, invoice_id: uuid.UUID, query: Query[schemas.InvoiceExportQuery]):
    # A file, sent as it is (ninja passes an HttpResponse through). The format is checked here: invalid_format.
    fmt = query.format
    if fmt not in FORMATS:
        raise ApiError(400, "invalid_format", "format is csv, xlsx or pdf.")
    invoice = invoice_get(access=billing_access(request.actor), invoice_id=invoice_id)
    return _download(invoice_export(invoice, fmt), fmt, export_filename(invoice, fmt))


@route(router, "GET", "/exports/revenue-share", name="revenue-share", scopes=FINANCE,
       summary="A period's revenue-share summary as CSV or XLSX." + FINANCE_ONLY, ok={200: None}, errors=(400,),
       openapi_extra=_download_doc("the revenue-share summary", ("csv", "xlsx")))
def revenue_share_view(request: HttpRequest, query: Query[schemas.RevenueShareQuery]):
    _operator(request)
    fmt = query.format
    if fmt not in ("csv", "xlsx"):
        raise ApiError(400, "invalid_format", "format is csv or xlsx.")
    period = _period(query.period)
    return _download(revenue_share_export(period, fmt), fmt, f"revenue-share-{period}.{fmt}")
