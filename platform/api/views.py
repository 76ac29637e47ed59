"""REST API v1: models, versions and runs for customer keys. Thin: parse, call a service, serialize."""

from __future__ import annotations

import uuid

from django.http import HttpRequest, JsonResponse

from accounts.selectors import organization_for_actor
from api.auth import ApiError, api_endpoint, json_body
from api.bounded import content_length
from api.openapi import openapi_document
from api.pagination import page_response
from api.serializers import model_dict, model_version_dict, run_dict
from catalog.selectors import model_get, model_list, model_version_get
from catalog.services import NamedUpload, model_version_upload
from catalog.validation import UploadRejected
from runs.selectors import run_get, run_list
from runs.services import MAX_CANDIDATE_BYTES, RunRejected, audit_start, run_cancel, run_start

# The whole request of an audit: one candidate module escaped as a JSON string (\uXXXX for non-ASCII
# text triples its size at most) or framed as multipart, plus a few short fields. Checked against
# Content-Length before anything is read.
AUDIT_REQUEST_MAX_BYTES = 3 * MAX_CANDIDATE_BYTES + 64 * 1024


def _uuid(value: object, what: str) -> uuid.UUID:
    if isinstance(value, str):
        try:
            return uuid.UUID(value)
        except ValueError:
            pass
    raise ApiError(400, "invalid_id", f"{what} must be an id (a string) like 0f8c2d1e-5b7a-4c1e-9a3b-2d4e6f8a0b1c; "
                                      f"got {str(value)[:60]!r}.")


@api_endpoint(methods=("GET",), public=True)
def openapi(request: HttpRequest) -> JsonResponse:
    return JsonResponse(openapi_document())


@api_endpoint(methods=("GET", "POST"))
def models(request: HttpRequest) -> JsonResponse:
    actor = request.actor
    if request.method == "GET":
        return page_response(request, model_list(actor=actor), "models", model_dict)
    files = request.FILES.getlist("files")
    uploads = [NamedUpload(path=f.name, file=f) for f in files]
    try:
        version = model_version_upload(actor=actor, organization=organization_for_actor(actor),
                                       model_name=request.POST.get("name", ""), uploads=uploads)
    except UploadRejected as exc:
        raise ApiError(403 if exc.code == "forbidden" else 400, exc.code, exc.message) from None
    return JsonResponse(model_version_dict(version, with_files=True), status=201)


@api_endpoint(methods=("GET",))
def model_detail(request: HttpRequest, model_id: uuid.UUID) -> JsonResponse:
    return JsonResponse(model_dict(model_get(actor=request.actor, model_id=model_id), with_versions=True))


@api_endpoint(methods=("GET",))
def model_version_detail(request: HttpRequest, version_id: uuid.UUID) -> JsonResponse:
    version = model_version_get(actor=request.actor, version_id=version_id)
    return JsonResponse(model_version_dict(version, with_files=True))


@api_endpoint(methods=("GET", "POST"))
def runs(request: HttpRequest) -> JsonResponse:
    actor = request.actor
    if request.method == "GET":
        # One query for the page's runs and one for their workload rows, whatever the page's size.
        return page_response(request, run_list(actor=actor).prefetch_related("workload_results"), "runs", run_dict)
    body = json_body(request)
    if "model_version" not in body or "hardware" not in body:
        raise ApiError(400, "missing_field", "Send model_version (an id) and hardware (e.g. \"cpu\").")
    version = model_version_get(actor=actor, version_id=_uuid(body["model_version"], "model_version"))
    try:
        batch, seq = int(body.get("batch", 1)), int(body.get("seq", 32))
    except (TypeError, ValueError):
        raise ApiError(400, "invalid_field", "batch and seq must be whole numbers.") from None
    try:
        run = run_start(actor=actor, version=version, hardware=str(body["hardware"]),
                        profile=str(body.get("profile", "cpu-ci")), batch=batch, seq=seq)
    except RunRejected as exc:
        raise ApiError(400, "run_rejected", str(exc)) from None
    return JsonResponse(run_dict(run), status=201)


@api_endpoint(methods=("GET",))
def run_detail(request: HttpRequest, run_id: uuid.UUID) -> JsonResponse:
    return JsonResponse(run_dict(run_get(actor=request.actor, run_id=run_id), with_events=True))


@api_endpoint(methods=("POST",))
def run_cancel_view(request: HttpRequest, run_id: uuid.UUID) -> JsonResponse:
    run = run_get(actor=request.actor, run_id=run_id)
    try:
        run_cancel(actor=request.actor, run=run)
    except RunRejected as exc:
        raise ApiError(409, "not_cancellable", str(exc)) from None
    run.refresh_from_db()
    return JsonResponse(run_dict(run))


@api_endpoint(methods=("POST",))
def audits(request: HttpRequest) -> JsonResponse:
    """Bring your own kernel: multipart (`candidate` file) or JSON (`source` text). Sizes are
    checked before the body is read: the request's Content-Length, then the file's."""
    actor = request.actor
    declared = content_length(request.META)
    if declared is not None and declared > AUDIT_REQUEST_MAX_BYTES:
        raise _candidate_too_large(f"The request is {declared:,} bytes (at most {AUDIT_REQUEST_MAX_BYTES:,} "
                                   "are read)")
    if request.content_type == "application/json":
        body = json_body(request, max_bytes=AUDIT_REQUEST_MAX_BYTES)
        source = body.get("source")
    else:
        body = request.POST
        upload = request.FILES.get("candidate")
        if upload is not None and upload.size > MAX_CANDIDATE_BYTES:
            raise _candidate_too_large(f"The candidate file is {upload.size:,} bytes")
        try:
            source = upload.read(MAX_CANDIDATE_BYTES + 1).decode("utf-8") if upload else None
        except UnicodeDecodeError:
            raise ApiError(400, "invalid_candidate", "The candidate file is not UTF-8 text; save the module "
                                                     "as UTF-8.") from None
    if not isinstance(source, str) or "workload" not in body:
        raise ApiError(400, "missing_field", "Send workload (a suite workload name) and the candidate module "
                                             "(multipart file `candidate`, or JSON string `source`).")
    try:
        run = audit_start(actor=actor, organization_id=organization_for_actor(actor).pk,
                          workload=str(body["workload"]), source=source, hardware=str(body.get("hardware", "cpu")),
                          profile=str(body.get("profile", "cpu-ci")))
    except RunRejected as exc:
        raise ApiError(400, "audit_rejected", str(exc)) from None
    return JsonResponse(run_dict(run), status=201)


def _candidate_too_large(what: str) -> ApiError:
    return ApiError(413, "candidate_too_large", f"{what}; a candidate module is at most "
                                                f"{MAX_CANDIDATE_BYTES // 1024} KiB. Keep generated tables out of "
                                                "it and send the module alone.")
