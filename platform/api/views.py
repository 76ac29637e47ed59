"""REST API v1: models, versions and runs for customer keys. Thin: parse, call a service, serialize."""

from __future__ import annotations

import uuid

from django.http import HttpRequest, JsonResponse

from accounts.selectors import organization_for_actor
from api.auth import ApiError, api_endpoint, json_body
from api.openapi import openapi_document
from api.serializers import model_dict, model_version_dict, run_dict
from catalog.selectors import model_get, model_list, model_version_get
from catalog.services import NamedUpload, model_version_upload
from catalog.validation import UploadRejected
from runs.selectors import run_get, run_list
from runs.services import RunRejected, audit_start, run_cancel, run_start


def _uuid(value: str, what: str) -> uuid.UUID:
    try:
        return uuid.UUID(str(value))
    except ValueError:
        raise ApiError(400, "invalid_id", f"{what} must be an id like 0f8c...; got {value!r}.") from None


@api_endpoint(methods=("GET",), public=True)
def openapi(request: HttpRequest) -> JsonResponse:
    return JsonResponse(openapi_document())


@api_endpoint(methods=("GET", "POST"))
def models(request: HttpRequest) -> JsonResponse:
    actor = request.actor
    if request.method == "GET":
        return JsonResponse({"models": [model_dict(m) for m in model_list(actor=actor)]})
    files = request.FILES.getlist("files")
    uploads = [NamedUpload(path=f.name, file=f) for f in files]
    try:
        version = model_version_upload(actor=actor, organization=organization_for_actor(actor),
                                       model_name=request.POST.get("name", ""), uploads=uploads)
    except UploadRejected as exc:
        raise ApiError(400, exc.code, exc.message) from None
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
        return JsonResponse({"runs": [run_dict(r) for r in run_list(actor=actor)[:200]]})
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
    """Bring your own kernel: multipart (`candidate` file) or JSON (`source` text)."""
    actor = request.actor
    if request.content_type == "application/json":
        body = json_body(request)
        source = body.get("source")
    else:
        body = request.POST
        upload = request.FILES.get("candidate")
        try:
            source = upload.read().decode("utf-8") if upload else None
        except UnicodeDecodeError:
            raise ApiError(400, "invalid_candidate", "The candidate file is not UTF-8 text.") from None
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
