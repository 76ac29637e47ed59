"""REST API v1 for reports: the signed bytes, their signature, disputes and re-audit requests.
Customer and auditor keys of the report's organization; any other organization's report is a 404.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import reverse

from api.auth import ApiError, api_endpoint, json_body
from api.openapi_parts import page_parameters, page_schema
from api.pagination import page_of
from reports.compare import compare_bodies, reaudit_dict
from reports.models import ReauditRequest, Report
from reports.selectors import reaudit_neighbours, report_auditors, reaudit_requests_of, report_get, report_list, signature_document
from reports.services import ReportRefused, reaudit_request, report_dispute

READERS = ("customer", "auditor")


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
        "links": {"body": reverse("reports:api-body", args=[report.pk]),
                  "signature": reverse("reports:api-signature", args=[report.pk]),
                  "page": reverse("reports:detail", args=[report.pk]),
                  "keys": reverse("reports:keys")},
    }


REFUSAL_STATUS = {"forbidden": 403, "window_closed": 409, "limit_reached": 409, "invalid_reason": 400}


def _refused(exc: ReportRefused) -> ApiError:
    return ApiError(REFUSAL_STATUS.get(exc.code, 400), exc.code, exc.message)


def _text(value) -> str | None:
    return None if value is None else str(value)


@api_endpoint(methods=("GET",), scopes=READERS)
def report_list_api(request: HttpRequest) -> JsonResponse:
    page = page_of(request, report_list(actor=request.actor))
    by_org = {r.organization_id: report_auditors(r) for r in page.rows}  # one read per organization
    return JsonResponse({"reports": [report_dict(r, by_org[r.organization_id]) for r in page.rows],
                         "next": page.next})


@api_endpoint(methods=("GET",), scopes=READERS)
def report_body(request: HttpRequest, report_id: uuid.UUID) -> HttpResponse:
    """The body bytes exactly as signed (never re-serialized: that would break the signature)."""
    report = report_get(actor=request.actor, report_id=report_id)
    response = HttpResponse(report.body_bytes, content_type="application/json")
    response["X-Dyno-Body-Sha256"] = report.body_sha256
    return response


@api_endpoint(methods=("GET",), scopes=READERS)
def report_signature(request: HttpRequest, report_id: uuid.UUID) -> JsonResponse:
    return JsonResponse(signature_document(report_get(actor=request.actor, report_id=report_id)))


def _comparison(original: Report, reaudit: Report) -> dict[str, Any]:
    return {"original": str(original.pk), "reaudit": str(reaudit.pk),
            **reaudit_dict(compare_bodies(json.loads(original.body_bytes), json.loads(reaudit.body_bytes)))}


def reaudit_request_dict(row: ReauditRequest) -> dict[str, Any]:
    return {"id": str(row.pk), "status": row.status, "report": str(row.report_id),
            "requested_by": row.requested_by, "reason": row.reason, "created_at": row.created_at.isoformat(),
            "run": str(row.run_id) if row.run_id else None,
            "result_report": str(row.result_report_id) if row.result_report_id else None,
            "error": row.error or None}


@api_endpoint(methods=("GET", "POST"), scopes=READERS)
def report_reaudit(request: HttpRequest, report_id: uuid.UUID) -> JsonResponse:
    report = report_get(actor=request.actor, report_id=report_id)
    if request.method == "GET":
        return _reaudits(report)
    try:
        reason = str(json_body(request).get("reason", ""))
        request_row = reaudit_request(actor=request.actor, report=report, reason=reason)
    except ReportRefused as exc:
        raise _refused(exc) from None
    return JsonResponse({"id": str(request_row.pk), "status": request_row.status, "report": str(report.pk),
                         "requested_by": request_row.requested_by,
                         "created_at": request_row.created_at.isoformat()}, status=201)


def _reaudits(report: Report) -> JsonResponse:
    """The re-audits asked of `report` and, measured, each beside the original figure by figure."""
    original, successor = reaudit_neighbours(report)
    return JsonResponse({
        "report": str(report.pk),
        "reaudits": [reaudit_request_dict(row) for row in reaudit_requests_of(report)],
        "superseded_by": _comparison(report, successor) if successor else None,
        "supersedes": _comparison(original, report) if original else None,
    })


@api_endpoint(methods=("POST",), scopes=READERS)
def report_disputes(request: HttpRequest, report_id: uuid.UUID) -> JsonResponse:
    report = report_get(actor=request.actor, report_id=report_id)
    try:
        reason = str(json_body(request).get("reason", ""))
        dispute = report_dispute(actor=request.actor, report=report, reason=reason)
    except ReportRefused as exc:
        raise _refused(exc) from None
    return JsonResponse({"id": str(dispute.pk), "status": dispute.status, "report": str(report.pk),
                         "reaudit": str(dispute.reaudit_id), "created_at": dispute.created_at.isoformat()},
                        status=201)


def openapi_paths() -> dict[str, Any]:
    """The report endpoints for /api/v1/openapi.json (merged in by api/openapi.py)."""
    uuid_param = {"name": "report_id", "in": "path", "required": True, "schema": {"type": "string", "format": "uuid"}}
    error = {"$ref": "#/components/schemas/Error"}

    texts = {400: "bad input", 401: "missing, unknown or revoked key", 403: "key scope or role not allowed",
             404: "no such report in your organization",
             409: "the dispute window is closed, or the re-measurement limit is reached (`limit_reached`)"}

    def responses(status: int, description: str, *errors: int) -> dict[str, Any]:
        ok = {"description": description, "content": {"application/json": {"schema": {"type": "object"}}}}
        return {str(status): ok, **{str(code): {"description": texts[code], "content": {
            "application/json": {"schema": error}}} for code in errors}}

    reason = {"content": {"application/json": {"schema": {"type": "object", "required": ["reason"],
                                                          "properties": {"reason": {"type": "string"}}}}}}
    return {
        "/reports": {"get": {"summary": "Your organization's signed reports, newest first (customer or auditor key)",
                             "parameters": page_parameters(),
                             "responses": {**responses(200, "reports", 400, 401, 403), "200": {
                                 "description": "reports", "content": {"application/json": {
                                     "schema": page_schema("reports", {"type": "object"})}}}}}},
        "/reports/{report_id}": {"get": {
            "summary": "The report body exactly as signed (canonical JSON, dyno.report/1); verify these bytes",
            "parameters": [uuid_param], "responses": responses(200, "the signed bytes", 401, 403, 404)}},
        "/reports/{report_id}/signature": {"get": {
            "summary": "The detached Ed25519 signature {key_id, algorithm, signature}; public keys at "
                       "/.well-known/dyno-report-keys.json",
            "parameters": [uuid_param], "responses": responses(200, "signature", 401, 403, 404)}},
        "/reports/{report_id}/reaudit": {
            "get": {"summary": "Re-audits asked of this report (status, run, resulting report) and, once measured, "
                               "each figure beside the original: speedups, CIs, difference, whether the re-audit "
                               "lies inside the original 95% CI (`superseded_by`; `supersedes` for a re-audit report)",
                    "parameters": [uuid_param],
                    "responses": responses(200, "re-audits and comparisons", 401, 403, 404)},
            "post": {"summary": "Request a re-audit (auditor key); a worker measures it again on current runners "
                                "and its report supersedes this one",
                     "parameters": [uuid_param], "requestBody": reason,
                     "responses": responses(201, "the re-audit request", 400, 401, 403, 404, 409)}},
        "/reports/{report_id}/disputes": {"post": {
            "summary": "Dispute a report inside the dispute window (customer key); asks for a re-audit",
            "parameters": [uuid_param], "requestBody": reason,
            "responses": responses(201, "the dispute", 400, 401, 403, 404, 409)}},
    }
