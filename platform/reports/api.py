"""REST API v1 for reports: the signed bytes, their signature, disputes and re-audit requests.
Customer and auditor keys of the report's organization; any other organization's report is a 404.
Thin, as api/views.py: the shapes are reports/schemas.py, the routes' declarations api/routes.route.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from ninja import Query, Router, Status

from api.routes import AUDITOR, CUSTOMER, documented, route
from api.auth import ApiError, json_body
from api.pagination import page_of
from api.schemas import PageQuery
from reports import schemas
from reports.compare import compare_bodies, reaudit_dict
from reports.models import ReauditRequest, Report
from reports.selectors import reaudit_neighbours, report_auditors, reaudit_requests_of, report_get, report_list, signature_document
from reports.services import ReportRefused, reaudit_request, report_dispute

router = Router(tags=["reports"])

READERS = CUSTOMER + AUDITOR

# The body of a dispute or a re-audit request, read by the view itself (not a typed parameter): who
# may ask (403) is decided before what was sent (400 invalid_reason), and the codes stay the services'.
REASON_BODY = {"requestBody": {"required": True, "content": {
    "application/json": {"schema": documented(schemas.ReportReason)}}}}
SIGNED_BODY = {"responses": {200: {
    "description": "the report body exactly as signed: canonical JSON (schema dyno.report/1), never re-serialized. "
                   "Verify these bytes, as received, against /reports/{report_id}/signature and the keys at "
                   "/.well-known/dyno-report-keys.json (`python -m proof verify`).",
    "headers": {"X-Dyno-Body-Sha256": {"description": "SHA-256 of the body, hex", "schema": {"type": "string"}}}}}}


def report_dict(report: Report, auditors: list | None = None) -> dict[str, Any]:
    auditors = report_auditors(report) if auditors is None else auditors
    return {
        "id": str(report.pk), "kind": report.kind, "organization": report.organization.slug,
        "run": str(report.run_id) if report.run_id else None, "hardware": report.hardware,
        "body_sha256": report.body_sha256, "key_id": report.key_id,
        "model_speedup": _text(report.model_speedup), "model_ci_low": _text(report.model_ci_low),
        "model_ci_high": _text(report.model_ci_high), "stable": report.stable,
        "supersedes": str(report.supersedes_id) if report.supersedes_id else None,
        "created_at": report.created_at.isoformat(),
        "auditors": [{"kind": a.kind, "label": a.label, "since": a.since.isoformat()} for a in auditors],
        "links": {"body": reverse("api:report-body", args=[report.pk]),
                  "signature": reverse("api:report-signature", args=[report.pk]),
                  "page": reverse("reports:detail", args=[report.pk]),
                  "keys": reverse("reports:keys")},
    }


REFUSAL_STATUS = {"forbidden": 403, "window_closed": 409, "limit_reached": 409, "invalid_reason": 400}


def _refused(exc: ReportRefused) -> ApiError:
    return ApiError(REFUSAL_STATUS.get(exc.code, 400), exc.code, exc.message)


def _text(value) -> str | None:
    return None if value is None else str(value)


@route(router, "GET", "/reports", name="reports", scopes=READERS,
       summary="Your organization's signed reports, newest first (customer or auditor key)",
       ok={200: schemas.ReportPage}, errors=(400,))
def report_list_api(request: HttpRequest, page: Query[PageQuery]):
    rows = page_of(request, report_list(actor=request.actor))
    by_org = {r.organization_id: report_auditors(r) for r in rows.rows}  # one read per organization
    return {"reports": [report_dict(r, by_org[r.organization_id]) for r in rows.rows], "next": rows.next}


@route(router, "GET", "/reports/{uuid:report_id}", name="report-body", scopes=READERS,
       summary="The report body exactly as signed (canonical JSON, dyno.report/1); verify these bytes",
       ok={200: schemas.ReportBody}, errors=(404,), openapi_extra=SIGNED_BODY)
def report_body(request: HttpRequest, report_id: uuid.UUID):
    """The body bytes exactly as signed (never re-serialized: that would break the signature). An
    HttpResponse, which ninja sends as it is: ReportBody documents it, it never validates it."""
    report = report_get(actor=request.actor, report_id=report_id)
    response = HttpResponse(report.body_bytes, content_type="application/json")
    response["X-Dyno-Body-Sha256"] = report.body_sha256
    return response


@route(router, "GET", "/reports/{uuid:report_id}/signature", name="report-signature", scopes=READERS,
       summary="The detached Ed25519 signature {key_id, algorithm, signature}; public keys at "
               "/.well-known/dyno-report-keys.json",
       ok={200: schemas.ReportSignature}, errors=(404,))
def report_signature(request: HttpRequest, report_id: uuid.UUID):
    return signature_document(report_get(actor=request.actor, report_id=report_id))


def _comparison(original: Report, reaudit: Report) -> dict[str, Any]:
    return {"original": str(original.pk), "reaudit": str(reaudit.pk),
            **reaudit_dict(compare_bodies(json.loads(original.body_bytes), json.loads(reaudit.body_bytes)))}


def reaudit_request_dict(row: ReauditRequest) -> dict[str, Any]:
    return {"id": str(row.pk), "status": row.status, "report": str(row.report_id),
            "requested_by": row.requested_by, "reason": row.reason, "created_at": row.created_at.isoformat(),
            "run": str(row.run_id) if row.run_id else None,
            "result_report": str(row.result_report_id) if row.result_report_id else None,
            "error": row.error or None}


@route(router, "GET", "/reports/{uuid:report_id}/reaudit", name="report-reaudit", scopes=READERS,
       summary="Re-audits asked of this report (status, run, resulting report) and, once measured, each figure "
               "beside the original: speedups, CIs, difference, whether the re-audit lies inside the original "
               "95% CI (`superseded_by`; `supersedes` for a re-audit report)",
       ok={200: schemas.ReportReaudits}, errors=(404,))
def report_reaudits(request: HttpRequest, report_id: uuid.UUID):
    """The re-audits asked of the report and, measured, each beside the original figure by figure."""
    report = report_get(actor=request.actor, report_id=report_id)
    original, successor = reaudit_neighbours(report)
    return {
        "report": str(report.pk),
        "reaudits": [reaudit_request_dict(row) for row in reaudit_requests_of(report)],
        "superseded_by": _comparison(report, successor) if successor else None,
        "supersedes": _comparison(original, report) if original else None,
    }


@route(router, "POST", "/reports/{uuid:report_id}/reaudit", name="report-reaudit", scopes=READERS,
       summary="Request a re-audit (auditor key); a worker measures it again on current runners and its report "
               "supersedes this one. 409: the re-measurement limit is reached (`limit_reached`)",
       ok={201: schemas.ReauditRequested}, errors=(400, 404, 409, 413), openapi_extra=REASON_BODY)
def report_reaudit(request: HttpRequest, report_id: uuid.UUID):
    report = report_get(actor=request.actor, report_id=report_id)
    try:
        reason = str(json_body(request).get("reason", ""))
        request_row = reaudit_request(actor=request.actor, report=report, reason=reason)
    except ReportRefused as exc:
        raise _refused(exc) from None
    return Status(201, {"id": str(request_row.pk), "status": request_row.status, "report": str(report.pk),
                        "requested_by": request_row.requested_by,
                        "created_at": request_row.created_at.isoformat()})


@route(router, "POST", "/reports/{uuid:report_id}/disputes", name="report-disputes", scopes=READERS,
       summary="Dispute a report inside the dispute window (customer key); asks for a re-audit. 409: the window "
               "is closed (`window_closed`) or the report was already re-measured (`limit_reached`)",
       ok={201: schemas.ReportDispute}, errors=(400, 404, 409, 413), openapi_extra=REASON_BODY)
def report_disputes(request: HttpRequest, report_id: uuid.UUID):
    report = report_get(actor=request.actor, report_id=report_id)
    try:
        reason = str(json_body(request).get("reason", ""))
        dispute = report_dispute(actor=request.actor, report=report, reason=reason)
    except ReportRefused as exc:
        raise _refused(exc) from None
    return Status(201, {"id": str(dispute.pk), "status": dispute.status, "report": str(report.pk),
                        "reaudit": str(dispute.reaudit_id), "created_at": dispute.created_at.isoformat()})
