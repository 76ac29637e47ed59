"""Web pages: sign-in, dashboard, models, uploads, runs, fleet and API keys. Thin views over services."""

from __future__ import annotations

import hashlib
import logging

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import authenticate, login, logout
from django.contrib.auth.decorators import login_required
from django.contrib.admin.views.decorators import staff_member_required
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from accounts.models import ApiKey, Role, Scope
from accounts.selectors import Actor, actor_for_user, api_keys_for_actor, organization_for_actor
from accounts.services import AccountError, api_key_create, api_key_revoke
from api.serializers import run_dict
from api.pagination import html_page
from catalog.selectors import model_get, model_list, model_version_get
from catalog.services import NamedUpload, model_version_upload
from catalog.validation import UploadRejected
from fleet.models import Runner, RunnerKey
from fleet.services import queue_depths
from runs.models import Run, RunKind
from runs.selectors import run_get, run_list
from runs.services import (
    PROFILES,
    RunRejected,
    artifact_bytes,
    audit_start,
    run_cancel,
    run_cancel_refusal,
    run_start,
)
from runs.status import Status
from runs.artifact_view import artifact_summary
from runners.names import workload_names

log = logging.getLogger(__name__)


def _actor(request: HttpRequest) -> Actor:
    return actor_for_user(request.user)


@require_http_methods(["GET", "POST"])
def signin(request: HttpRequest) -> HttpResponse:
    """The password is checked through accounts.backends.LockoutBackend: a locked account or a
    locked address (for a wrong password) answers 429 with Retry-After here."""
    error = ""
    username = ""
    if request.method == "POST":
        username = request.POST.get("email", "").strip().lower()
        user = authenticate(request, username=username, password=request.POST.get("password", ""))
        if user is not None:
            login(request, user)  # accounts.backends.signed_in records it and proves this browser
            target = request.GET.get("next", "")
            return redirect(target if target.startswith("/") and not target.startswith("//")
                            else "front:dashboard")
        refused = getattr(request, "signin_refused", None)
        if refused is not None:
            response = render(request, "front/signin.html", {"error": refused.message, "email": username},
                              status=refused.status)
            response["Retry-After"] = str(refused.retry_after)
            return response
        error = "That email and password do not match an account."
    return render(request, "front/signin.html", {"error": error, "email": username})


@require_POST
def signout(request: HttpRequest) -> HttpResponse:
    logout(request)
    return redirect("front:signin")


@login_required
def dashboard(request: HttpRequest) -> HttpResponse:
    actor = _actor(request)
    return render(request, "front/dashboard.html", {
        "models": model_list(actor=actor)[:10],
        "runs": run_list(actor=actor)[:10],
        "counts": {s: run_list(actor=actor).filter(status=s).count() for s in Status.values},
    })


@login_required
def models(request: HttpRequest) -> HttpResponse:
    pager = html_page(request, model_list(actor=_actor(request)))
    return render(request, "front/models.html", {"models": pager.rows, "pager": pager})


@login_required
def model_detail(request: HttpRequest, model_id) -> HttpResponse:
    model = model_get(actor=_actor(request), model_id=model_id)
    return render(request, "front/model_detail.html", {"model": model, "versions": model.versions.all()})


@login_required
@require_http_methods(["GET", "POST"])
def upload(request: HttpRequest) -> HttpResponse:
    actor = _actor(request)
    error = None
    name = request.GET.get("name", "")
    if request.method == "POST":
        name = request.POST.get("name", "")
        files = request.FILES.getlist("files")
        paths = request.POST.getlist("paths")
        uploads = [NamedUpload(path=paths[i] if i < len(paths) and paths[i] else f.name, file=f)
                   for i, f in enumerate(files)]
        try:
            organization = organization_for_actor(actor)
            if not actor.can_write(organization.pk):
                raise UploadRejected("forbidden", "Your role cannot upload models; ask an owner.")
            version = model_version_upload(actor=actor, organization=organization, model_name=name,
                                           uploads=uploads)
        except UploadRejected as exc:
            error = exc
        else:
            messages.success(request, f"Uploaded {version} ({version.family}, "
                                      f"{version.parameter_count:,} parameters).")
            return redirect("front:version-detail", version_id=version.id)
    return render(request, "front/upload.html", {"error": error, "name": name},
                  status=400 if error else 200)


@login_required
def version_detail(request: HttpRequest, version_id) -> HttpResponse:
    actor = _actor(request)
    version = model_version_get(actor=actor, version_id=version_id)
    runs = run_list(actor=actor).filter(model_version=version)
    latest = runs.filter(status=Status.SUCCEEDED).first()
    live = set(Runner.objects.values_list("hardware", flat=True))
    return render(request, "front/version_detail.html", {
        "version": version, "files": version.files.all(), "runs": runs[:20], "latest": latest,
        "hardware_classes": [(h, h in live) for h in settings.DYNO_HARDWARE_CLASSES],
        "profiles": PROFILES, "can_write": actor.can_write(version.model.organization_id),
    })


@login_required
@require_POST
def run_create(request: HttpRequest, version_id) -> HttpResponse:
    actor = _actor(request)
    version = model_version_get(actor=actor, version_id=version_id)
    try:
        run = run_start(actor=actor, version=version, hardware=request.POST.get("hardware", ""),
                        profile=request.POST.get("profile", "cpu-ci"),
                        batch=int(request.POST.get("batch") or 1), seq=int(request.POST.get("seq") or 32))
    except (RunRejected, ValueError) as exc:
        messages.error(request, str(exc) if isinstance(exc, RunRejected) else "batch and seq must be numbers.")
        return redirect("front:version-detail", version_id=version.id)
    return redirect("front:run-detail", run_id=run.id)


@login_required
def runs(request: HttpRequest) -> HttpResponse:
    pager = html_page(request, run_list(actor=_actor(request)))
    return render(request, "front/runs.html", {"runs": pager.rows, "pager": pager})


@login_required
def run_detail(request: HttpRequest, run_id) -> HttpResponse:
    actor = _actor(request)
    run = run_get(actor=actor, run_id=run_id)
    return render(request, "front/run_detail.html",
                  {"run": run, "can_cancel": run_cancel_refusal(actor=actor, run=run) is None,
                   "optimization": artifact_summary(run.artifact)})


@login_required
def run_result(request: HttpRequest, run_id) -> HttpResponse:
    """The raw dyno.suite-result/1 document, as stored."""
    run = run_get(actor=_actor(request), run_id=run_id)
    if run.result is None:
        raise Http404("This run has no result yet.")
    response = JsonResponse(run.result, json_dumps_params={"indent": 1})
    response["Content-Disposition"] = f'attachment; filename="dyno-result-{run.id}.json"'
    return response


@login_required
def run_artifact(request: HttpRequest, run_id) -> HttpResponse:
    """The optimization artifact (dyno.optimization-artifact/1) a customer deploys with optimizer.apply,
    as the bytes whose sha256 the run stored and its report signs (a report's recipe checks them)."""
    run = run_get(actor=_actor(request), run_id=run_id)
    if run.artifact is None:
        raise Http404("This run has no optimization artifact.")
    body = artifact_bytes(run.artifact)
    if hashlib.sha256(body).hexdigest() != run.artifact_sha256:
        log.error("run %s: the stored artifact no longer hashes to its artifact_sha256 %s", run.pk, run.artifact_sha256)
        return HttpResponse("This run's stored artifact does not match its signed hash; we have logged it.",
                            status=500, content_type="text/plain; charset=utf-8")
    return _download(body, "artifact.json", "application/json")


@login_required
def run_candidate(request: HttpRequest, run_id) -> HttpResponse:
    """An audit's submitted candidate module, byte for byte (its sha256 is the run's and the report's)."""
    run = run_get(actor=_actor(request), run_id=run_id)
    if run.kind != RunKind.AUDIT:
        raise Http404("Only the audit of a submitted candidate has a candidate module.")
    return _download(run.candidate_source.encode("utf-8"), "candidate.py", "text/x-python; charset=utf-8")


def _download(body: bytes, filename: str, content_type: str) -> HttpResponse:
    response = HttpResponse(body, content_type=content_type)
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


@login_required
@require_http_methods(["GET", "POST"])
def audit_new(request: HttpRequest) -> HttpResponse:
    """Bring your own kernel: upload a candidate module for one suite workload."""
    actor = _actor(request)
    error = None
    if request.method == "POST":
        upload = request.FILES.get("candidate")
        try:
            source = upload.read().decode("utf-8") if upload else ""
            run = audit_start(actor=actor, organization_id=organization_for_actor(actor).pk,
                              workload=request.POST.get("workload", ""), source=source,
                              hardware=request.POST.get("hardware", ""), profile=request.POST.get("profile", "cpu-ci"))
        except UnicodeDecodeError:
            error = "The candidate file is not UTF-8 text."
        except RunRejected as exc:
            error = str(exc)
        else:
            return redirect("front:run-detail", run_id=run.id)
    return render(request, "front/audit_new.html", {
        "error": error, "workloads": workload_names(), "profiles": PROFILES,
        "hardware_classes": settings.DYNO_HARDWARE_CLASSES,
    }, status=400 if error else 200)


@login_required
def run_status(request: HttpRequest, run_id) -> JsonResponse:
    """What the run page polls: status, progress and the log, without the full inventory."""
    run = run_get(actor=_actor(request), run_id=run_id)
    data = run_dict(run, with_events=True)
    for bulky in ("inventory", "workloads"):
        data.pop(bulky, None)
    return JsonResponse(data)


@login_required
@require_POST
def run_cancel_view(request: HttpRequest, run_id) -> HttpResponse:
    actor = _actor(request)
    run = run_get(actor=actor, run_id=run_id)
    try:
        run_cancel(actor=actor, run=run)
        messages.info(request, "Run cancelled.")
    except RunRejected as exc:
        messages.error(request, str(exc))
    return redirect("front:run-detail", run_id=run.id)


@staff_member_required(login_url="front:signin")
def fleet(request: HttpRequest) -> HttpResponse:
    queues = settings.DYNO_HARDWARE_CLASSES
    depths = queue_depths(list(queues))
    running = {h: Run.objects.filter(hardware=h, status=Status.RUNNING).count() for h in queues}
    return render(request, "front/fleet.html", {
        "runners": Runner.objects.select_related("key"),
        "queues": [(q, depths.get(q), running[q]) for q in queues],
        "keys": RunnerKey.objects.all(),
        "calibration_required": settings.DYNO_REQUIRE_RUNNER_CALIBRATION,
    })


@login_required
@require_http_methods(["GET", "POST"])
def api_keys(request: HttpRequest) -> HttpResponse:
    actor = _actor(request)
    organization = organization_for_actor(actor)
    is_owner = actor.role_in(organization.pk) == Role.OWNER
    new_key = None
    if request.method == "POST":
        if not is_owner:
            messages.error(request, "Only owners manage API keys.")
        elif "revoke" in request.POST:
            key = ApiKey.objects.filter(organization=organization, prefix=request.POST["revoke"]).first()
            if key:
                api_key_revoke(key=key, actor=actor)
                messages.info(request, f"Key {key.name} revoked.")
        else:
            try:
                _, new_key = api_key_create(organization=organization, scope=request.POST.get("scope", ""),
                                            name=request.POST.get("name", ""), created_by=request.user,
                                            operator=request.user.is_staff)
            except AccountError as exc:
                messages.error(request, str(exc))
    return render(request, "front/api_keys.html", {
        "keys": api_keys_for_actor(actor).filter(organization=organization), "new_key": new_key,
        "scopes": [s for s in Scope.values if s != Scope.AUDITOR or request.user.is_staff],
        "is_owner": is_owner, "organization": organization,
    })
