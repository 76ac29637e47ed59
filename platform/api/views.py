"""REST API v1: models, versions and runs for customer keys. Thin: parse, call a service, serialize;
the shapes are api/schemas.py, the routes' declarations (who, what answers) api/routes.route."""

from __future__ import annotations

import uuid

from django.http import HttpRequest
from ninja import Query, Router, Status

from accounts.selectors import organization_for_actor
from api import schemas
from api.routes import documented, route
from api.auth import ApiError, json_body
from api.bounded import content_length, id_bounded
from api.pagination import page_body
from api.serializers import model_dict, model_version_dict, run_dict
from catalog.selectors import model_get, model_list, model_version_get
from catalog.services import NamedUpload, model_version_upload
from catalog.validation import UploadRejected
from runs.selectors import run_get, run_list
from runs.services import MAX_CANDIDATE_BYTES, RunRejected, audit_start, run_cancel, run_start

router = Router(tags=["models and runs"])

# The whole request of an audit: one candidate module escaped as a JSON string (\uXXXX for non-ASCII
# text triples its size at most) or framed as multipart, plus a few short fields. Checked against
# Content-Length before anything is read.
AUDIT_REQUEST_MAX_BYTES = 3 * MAX_CANDIDATE_BYTES + 64 * 1024

UPLOAD_BODY = {"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": {
    "type": "object", "required": ["name", "files"],
    "properties": {"name": {"type": "string", "description": "the model's name (a new one, or one you have)"},
                   "files": {"type": "array", "items": {"type": "string", "format": "binary"},
                             "description": "an HF folder's files, a config.json alone, or one zip"}}}}}}}
AUDIT_BODY = {"requestBody": {"required": True, "content": {
    "multipart/form-data": {"schema": {
        "type": "object", "required": ["workload", "candidate"],
        "properties": {"workload": {"type": "string"}, "hardware": {"type": "string", "default": "cpu"},
                       "profile": {"enum": ["cpu-ci", "cpu", "gpu"], "default": "cpu-ci"},
                       "candidate": {"type": "string", "format": "binary"}}}},
    "application/json": {"schema": documented(schemas.AuditJson)}}}}


@route(router, "GET", "/models", name="models", summary="Your organization's models, newest first",
       ok={200: schemas.ModelPage}, errors=(400,))
def models_list(request: HttpRequest, page: Query[schemas.PageQuery]):
    return page_body(request, model_list(actor=request.actor), "models", model_dict)


@route(router, "POST", "/models", name="models",
       summary="Upload a model version (HF folder files, a config.json alone, or one zip)",
       ok={201: schemas.ModelVersion}, errors=(400, 413), openapi_extra=UPLOAD_BODY)
def model_upload(request: HttpRequest):
    actor = request.actor
    uploads = [NamedUpload(path=f.name, file=f) for f in request.FILES.getlist("files")]
    try:
        version = model_version_upload(actor=actor, organization=organization_for_actor(actor),
                                       model_name=request.POST.get("name", ""), uploads=uploads)
    except UploadRejected as exc:
        raise ApiError(403 if exc.code == "forbidden" else 400, exc.code, exc.message) from None
    return Status(201, model_version_dict(version, with_files=True))


@route(router, "GET", "/models/{uuid:model_id}", name="model-detail", summary="A model with its versions",
       ok={200: schemas.Model}, errors=(404,))
def model_detail(request: HttpRequest, model_id: uuid.UUID):
    return model_dict(model_get(actor=request.actor, model_id=model_id), with_versions=True)


@route(router, "GET", "/model-versions/{uuid:version_id}", name="model-version-detail",
       summary="A model version with its files' hashes", ok={200: schemas.ModelVersion}, errors=(404,))
def model_version_detail(request: HttpRequest, version_id: uuid.UUID):
    return model_version_dict(model_version_get(actor=request.actor, version_id=version_id), with_files=True)


@route(router, "GET", "/runs", name="runs", summary="Your organization's runs, newest first",
       ok={200: schemas.RunPage}, errors=(400,))
def runs_list(request: HttpRequest, page: Query[schemas.PageQuery]):
    # One query for the page's runs and one for their workload rows, whatever the page's size.
    return page_body(request, run_list(actor=request.actor).prefetch_related("workload_results"), "runs", run_dict)


@route(router, "POST", "/runs", name="runs", summary="Start a run of a model version on a hardware class",
       ok={201: schemas.Run}, errors=(400, 404, 413))
def run_create(request: HttpRequest, body: schemas.RunRequest):
    actor = request.actor
    version = model_version_get(actor=actor, version_id=id_bounded(body.model_version, what="model_version"))
    try:
        run = run_start(actor=actor, version=version, hardware=body.hardware, profile=body.profile,
                        batch=body.batch, seq=body.seq)
    except RunRejected as exc:
        raise ApiError(400, "run_rejected", str(exc)) from None
    return Status(201, run_dict(run))


@route(router, "GET", "/runs/{uuid:run_id}", name="run-detail",
       summary="A run's status, stage, progress, log and result", ok={200: schemas.Run}, errors=(404,))
def run_detail(request: HttpRequest, run_id: uuid.UUID):
    return run_dict(run_get(actor=request.actor, run_id=run_id), with_events=True)


@route(router, "POST", "/runs/{uuid:run_id}/cancel", name="run-cancel", summary="Cancel a queued or running run",
       ok={200: schemas.Run}, errors=(404, 409))
def run_cancel_view(request: HttpRequest, run_id: uuid.UUID):
    run = run_get(actor=request.actor, run_id=run_id)
    try:
        run_cancel(actor=request.actor, run=run)
    except RunRejected as exc:
        raise ApiError(409, "not_cancellable", str(exc)) from None
    run.refresh_from_db()
    return run_dict(run)


@route(router, "POST", "/audits", name="audits",
       summary="Audit a submitted candidate module for one suite workload (bring your own kernel)",
       ok={201: schemas.Run}, errors=(400, 413), openapi_extra=AUDIT_BODY)
def audits(request: HttpRequest):
    """Multipart (`candidate` file) or JSON (`source` text, the AuditJson model). Sizes are checked
    before the body is read: the request's Content-Length, then the file's."""
    actor = request.actor
    declared = content_length(request.META)
    if declared is not None and declared > AUDIT_REQUEST_MAX_BYTES:
        raise _candidate_too_large(f"The request is {declared:,} bytes (at most {AUDIT_REQUEST_MAX_BYTES:,} "
                                   "are read)")
    if request.content_type == "application/json":
        fields = dict(json_body(request, max_bytes=AUDIT_REQUEST_MAX_BYTES))
        source = fields.get("source")
    else:
        fields = {key: request.POST.get(key) for key in ("workload", "hardware", "profile") if key in request.POST}
        upload = request.FILES.get("candidate")
        if upload is not None and upload.size > MAX_CANDIDATE_BYTES:
            raise _candidate_too_large(f"The candidate file is {upload.size:,} bytes")
        try:
            source = upload.read(MAX_CANDIDATE_BYTES + 1).decode("utf-8") if upload else None
        except UnicodeDecodeError:
            raise ApiError(400, "invalid_candidate", "The candidate file is not UTF-8 text; save the module "
                                                     "as UTF-8.") from None
    if not isinstance(source, str) or "workload" not in fields:
        raise ApiError(400, "missing_field", "Send workload (a suite workload name) and the candidate module "
                                             "(multipart file `candidate`, or JSON string `source`).")
    request_ = schemas.AuditJson.model_validate({**fields, "source": source})  # the same model the document names
    try:
        run = audit_start(actor=actor, organization_id=organization_for_actor(actor).pk,
                          workload=request_.workload, source=request_.source, hardware=request_.hardware,
                          profile=request_.profile)
    except RunRejected as exc:
        raise ApiError(400, "audit_rejected", str(exc)) from None
    return Status(201, run_dict(run))


@route(router, "GET", "/audits/{uuid:run_id}", name="audit-detail",
       summary="An audit's status, verdict and per-check result", ok={200: schemas.Run}, errors=(404,))
def audit_detail(request: HttpRequest, run_id: uuid.UUID):
    return run_dict(run_get(actor=request.actor, run_id=run_id), with_events=True)


def _candidate_too_large(what: str) -> ApiError:
    return ApiError(413, "candidate_too_large", f"{what}; a candidate module is at most "
                                                f"{MAX_CANDIDATE_BYTES // 1024} KiB. Keep generated tables out of "
                                                "it and send the module alone.")
