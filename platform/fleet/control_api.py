"""The control API: what a runner host may ask of the platform, and nothing more.

Runner hosts execute hostile candidate code (sandboxed, but a sandbox is one layer), so they hold no
database credentials and no signing key: a runner presents its runner key (fleet.keys, scoped to
hardware classes) to these endpoints, which alone write what it reports through the same services
the platform uses everywhere else. What a key can do: register workers (a worker name stays bound to
the key it registered with while that key is live), and for those workers only: claim a queued run
of its hardware classes, report progress, logs and the outcome of a run the worker holds, download
that run's model files, heartbeat and calibrate. It cannot read another run's data, speak for
another key's workers, list anything, or touch billing, reports or accounts.

Every answer is JSON (`{"error": {"code", "message"}}` on refusal). The runner side is
fleet.control_client.
"""

from __future__ import annotations

import ipaddress
import logging
from functools import wraps
from typing import Any, Callable

from django.conf import settings
from django.http import FileResponse, HttpRequest, HttpResponse, JsonResponse
from django.http.response import HttpResponseBase
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

from accounts.clients import client_address
from api.bounded import InputRejected, id_bounded, json_object_bounded
from api.errors import error_response, internal_response
from fleet.keys import runner_key_for
from fleet.models import Runner, RunnerKey
from fleet.services import (
    runner_calibration_record,
    runner_calibration_summary,
    runner_heartbeat,
    runner_register,
    runner_stopped,
    uncalibrated_summary,
)
from runs.models import Run, RunKind
from runs.services import (
    RunCancelled,
    run_claim,
    run_fail,
    run_log,
    run_progress,
    result_problem,
    run_succeed,
    runs_fail_held_by,
    runs_heartbeat,
)
from runs.status import Status
from runs.limits import failed_outside_error

log = logging.getLogger(__name__)

# A result document with every round's samples of a large suite stays well under this.
MAX_BODY_BYTES = 64 << 20
MAX_TEXT = 4000


class Refused(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def _body(request: HttpRequest) -> dict[str, Any]:
    try:
        length = int(request.headers.get("Content-Length") or 0)
    except ValueError:
        raise Refused(400, "invalid_length", "Content-Length is not a number of bytes.") from None
    if length > MAX_BODY_BYTES:
        raise Refused(413, "too_large", f"the body is {length} bytes; at most {MAX_BODY_BYTES} are read.")
    raw = request.read(MAX_BODY_BYTES + 1)
    if len(raw) > MAX_BODY_BYTES:
        raise Refused(413, "too_large", f"the body exceeds {MAX_BODY_BYTES} bytes.")
    try:
        # Bounded like every API body: no NaN or Infinity, no nesting past MAX_DEPTH, no NUL in a
        # string (PostgreSQL stores none: a result, log line or hostname with one failed the write).
        return json_object_bounded(raw or b"{}", max_bytes=MAX_BODY_BYTES, what="the body")
    except InputRejected as exc:
        raise Refused(400, exc.code, exc.message) from None


def _text(body: dict[str, Any], name: str, *, required: bool = True, limit: int = MAX_TEXT) -> str:
    value = body.get(name, "")
    if not isinstance(value, str) or (required and not value.strip()):
        raise Refused(400, "invalid_field", f"`{name}` must be a non-empty string.")
    return value[:limit]


def _from_runner_network(request: HttpRequest) -> bool:
    """Whether the client (behind the trusted proxies) is in DYNO_CONTROL_API_NETWORKS, if set."""
    networks = settings.DYNO_CONTROL_API_NETWORKS
    if not networks:
        return True
    address = client_address(request)
    return address is not None and any(ipaddress.ip_address(address) in network for network in networks)


def endpoint(method: str) -> Callable:
    """Authenticate the runner key, parse the body, turn refusals into the JSON error contract."""

    def wrap(view: Callable[..., Any]) -> Callable[..., HttpResponse]:
        @csrf_exempt
        @wraps(view)
        def handle(request: HttpRequest, **kwargs: Any) -> HttpResponse:
            if not _from_runner_network(request):
                return error_response(404, "not_found", "no such endpoint.")
            if request.method != method:
                return error_response(405, "method_not_allowed", f"use {method}.")
            header = request.headers.get("Authorization", "")
            key = runner_key_for(header.removeprefix("Bearer ").strip()) if header.startswith("Bearer ") else None
            if key is None:
                return error_response(401, "unauthenticated", "present a live runner key: Authorization: Bearer "
                                                              "<DYNO_RUNNER_TOKEN> (manage.py runner_key create).")
            try:
                body = _body(request) if method == "POST" else {}
                answer = view(request, key, body, **kwargs)
            except Refused as exc:
                return error_response(exc.status, exc.code, exc.message)
            except Exception as exc:  # noqa: BLE001 - every answer is JSON, failures too (logged with an incident id)
                return internal_response(request, exc)
            return answer if isinstance(answer, HttpResponseBase) else JsonResponse(answer)

        return handle

    return wrap


def _run_for(key: RunnerKey, run_id: str) -> Run:
    """The run, if this key's hardware classes include it; 404 otherwise (as if it did not exist)."""
    run = Run.objects.select_related("model_version", "repeat_of").filter(pk=run_id).first()
    if run is None or not key.serves(run.hardware):
        raise Refused(404, "not_found", "no such run for this runner key.")
    return run


def _held(run: Run, worker: str) -> None:
    if run.status != Status.RUNNING or run.worker != worker:
        raise Refused(409, "not_held", f"run {run.pk} is {run.status}, not running on {worker}: stop working on it.")


def _bound(key: RunnerKey, hostname: str) -> str:
    """`hostname`, if it registered with this key: a key acts only for the workers it registered,
    so a host that falls cannot speak for another pool's workers (or fail their runs)."""
    if not Runner.objects.filter(hostname=hostname, key=key).exists():
        raise Refused(403, "not_registered", f"worker {hostname} is not registered with runner key {key.name}; a runner "
                                             "registers when it starts (workers/register).")
    return hostname


def _worker(body: dict[str, Any], key: RunnerKey) -> str:
    return _bound(key, _text(body, "worker", limit=200))


def _job(run: Run) -> dict[str, Any]:
    """Everything a runner needs to execute `run`: the runner reads nothing else."""
    job: dict[str, Any] = {"run_id": str(run.pk), "kind": run.kind, "hardware": run.hardware, "profile": run.profile}
    if run.kind == RunKind.AUDIT:
        job.update(workload=run.workload, candidate_source=run.candidate_source)
    else:
        files = list(run.model_version.files.values("path", "size", "sha256"))
        job.update(batch=run.batch, seq=run.seq, model_version=str(run.model_version_id), model_files=files,
                   replay=run.repeat_of.artifact if run.repeat_of_id is not None else None)
    return job


@endpoint("POST")
def claim(request: HttpRequest, key: RunnerKey, body: dict[str, Any], run_id: str) -> dict[str, Any]:
    """Take a queued run: its job, and the fingerprint the worker registered (to compare with now).

    `again` (a retried request or a redelivered task) finds a run this worker already holds still
    its own: a claim that landed but whose answer was lost. Without it, a run held by anyone is not
    claimed again, by its own worker included (a stale message of a run it holds)."""
    run = _run_for(key, run_id)  # 404 for a run out of the key's scope, before anything else
    worker = _worker(body, key)
    if not run_claim(run_id=run.pk, worker=worker):
        run.refresh_from_db(fields=["status", "worker"])
        if not (body.get("again") is True and run.status == Status.RUNNING and run.worker == worker):
            raise Refused(409, "not_queued", f"run {run.pk} is {run.status}; nothing to do.")
    registered = Runner.objects.filter(hostname=worker).values_list("fingerprint_sha256", flat=True).first()
    return {"job": _job(run), "registered_fingerprint_sha256": registered}


@endpoint("POST")
def progress(request: HttpRequest, key: RunnerKey, body: dict[str, Any], run_id: str) -> dict[str, Any]:
    run = _run_for(key, run_id)  # 404 for a run out of the key's scope, before anything else
    worker = _worker(body, key)
    fraction = body.get("fraction")
    if not isinstance(fraction, (int, float)) or isinstance(fraction, bool):
        raise Refused(400, "invalid_field", "`fraction` must be a number from 0 to 1.")
    try:
        run_progress(run_id=run.pk, worker=worker, fraction=float(fraction),
                     message=_text(body, "message", required=False),
                     stage=_text(body, "stage", required=False, limit=32) or None)
    except RunCancelled:
        run.refresh_from_db(fields=["status", "worker"])
        _held(run, worker)
    return {"ok": True}


@endpoint("POST")
def log_line(request: HttpRequest, key: RunnerKey, body: dict[str, Any], run_id: str) -> dict[str, Any]:
    run = _run_for(key, run_id)  # 404 for a run out of the key's scope, before anything else
    worker = _worker(body, key)
    if run.worker != worker:  # its own runs only; a cancelled one still takes the note that it stopped
        raise Refused(409, "not_held", f"run {run.pk} is not {worker}'s.")
    level = body.get("level", "info")
    run_log(run.pk, _text(body, "message"), level=level if level in ("info", "warning", "error") else "info")
    return {"ok": True}


@endpoint("POST")
def succeed(request: HttpRequest, key: RunnerKey, body: dict[str, Any], run_id: str) -> dict[str, Any]:
    """Store a run's outcome, all at once (runs.services.run_succeed), with the calibration of the
    runner that measured it. `stored` False: the run was cancelled or taken meanwhile."""
    run = _run_for(key, run_id)  # 404 for a run out of the key's scope, before anything else
    worker = _worker(body, key)
    outcome = {name: body.get(name) for name in ("inventory", "result", "artifact")}
    for name, value in outcome.items():
        if value is not None and not isinstance(value, dict):
            raise Refused(400, "invalid_field", f"`{name}` must be a JSON object or null.")
    result = outcome.get("result")
    problem = result_problem(result) if isinstance(result, dict) else None
    if problem is not None:
        raise Refused(400, "invalid_result", f"the result document does not fit: {problem}. The run stays running; "
                                             "send a corrected document.")
    if isinstance(result, dict):
        _platform_says(result, worker)
    return {"stored": run_succeed(run_id=run.pk, worker=worker, **outcome)}


def _platform_says(result: dict[str, Any], worker: str) -> None:
    """What decides whether a result may bill is the platform's, not the runner's document: the
    calibration is the one this platform stored for the worker, judged by the platform
    (fleet.models.calibration_judged; none stored: an uncalibrated runner, or no block where the
    operator turned DYNO_REQUIRE_RUNNER_CALIBRATION off, whatever the runner wrote), and an
    incomplete sandbox bills only if this platform allows runners to say so
    (DYNO_SANDBOX_ALLOW_INCOMPLETE). Red team 16 (2026-12-06) stored a result whose sandbox block
    said `complete: false, operator_allowed_incomplete: true` and got a billable report, and a
    `runner_calibration` it wrote itself was kept for a worker with none stored."""
    environment = result.setdefault("environment", {})
    summary = runner_calibration_summary(hostname=worker)
    if summary is None and settings.DYNO_REQUIRE_RUNNER_CALIBRATION:
        # A runner that never calibrated (or whose calibration never arrived) is not a calibrated
        # one: red team 18 left this open, a worker that skipped its calibration billed.
        summary = uncalibrated_summary()
    if summary is not None:
        environment["runner_calibration"] = summary
    else:
        environment.pop("runner_calibration", None)
    sandbox = result.get("sandbox")
    if not isinstance(sandbox, dict) or not isinstance(sandbox.get("complete"), bool):
        # A result that does not say whether its sandbox was complete is not taken as complete
        # (reports.document.sandbox_trusted reads a missing block as an old, trusted result).
        sandbox = result["sandbox"] = {**(sandbox if isinstance(sandbox, dict) else {}), "complete": False,
                                       "missing": ["unreported: the runner's result did not say"]}
    if sandbox.get("operator_allowed_incomplete") and not settings.DYNO_SANDBOX_ALLOW_INCOMPLETE:
        sandbox["operator_allowed_incomplete"] = False
        sandbox["platform_refused_allowance"] = True


@endpoint("POST")
def fail(request: HttpRequest, key: RunnerKey, body: dict[str, Any], run_id: str) -> dict[str, Any]:
    """A run's failure, said by its worker; `outside` (a killed pool process, a hard time limit)
    names what ended it, and the message is written here from the run's stage."""
    run = _run_for(key, run_id)  # 404 for a run out of the key's scope, before anything else
    worker = _worker(body, key)
    outside = body.get("outside")
    if outside is not None:
        if run.status != Status.RUNNING or run.worker != worker:
            return {"failed": False}  # not this worker's (a duplicate delivery's process died): left alone
        error = failed_outside_error(kind=str(outside), stage=run.stage, detail=_text(body, "error", required=False))
        return {"failed": run_fail(run_id=run.pk, error=error, worker=worker)}
    return {"failed": run_fail(run_id=run.pk, error=_text(body, "error"), worker=worker)}


@endpoint("GET")
def model_file(request: HttpRequest, key: RunnerKey, body: dict[str, Any], run_id: str, name: str) -> HttpResponse:
    """One file of the model version a running model run measures, for the worker that holds it."""
    from catalog.services import version_path

    run = _run_for(key, run_id)
    _bound(key, request.GET.get("worker", ""))
    if run.kind != RunKind.MODEL or run.status != Status.RUNNING or run.worker != request.GET.get("worker"):
        raise Refused(404, "not_found", "no model files for this run now (only its worker reads them, while it runs).")
    if not run.model_version.files.filter(path=name).exists():
        raise Refused(404, "not_found", "no such file in this run's model version.")
    root = version_path(run.model_version).resolve()
    target = (root / name).resolve()
    if root not in target.parents or not target.is_file():
        raise Refused(404, "not_found", "no such file in this run's model version.")
    return FileResponse(open(target, "rb"), content_type="application/octet-stream")


def _hardware_of(key: RunnerKey, queues: list[str]) -> None:
    served = [q for q in queues if q in settings.DYNO_HARDWARE_CLASSES]
    refused = [q for q in served if not key.serves(q)]
    if refused:
        raise Refused(403, "out_of_scope", f"runner key {key.name} does not serve {', '.join(refused)}; "
                                           f"it serves {', '.join(key.hardware)}.")


@endpoint("POST")
def register(request: HttpRequest, key: RunnerKey, body: dict[str, Any]) -> dict[str, Any]:
    """A worker that (re)starts: whatever it held died with it; then it is registered."""
    hostname = _text(body, "hostname", limit=200)
    queues = body.get("queues")
    fingerprint = body.get("fingerprint")
    if not isinstance(queues, list) or not all(isinstance(q, str) for q in queues) or not isinstance(fingerprint, dict):
        raise Refused(400, "invalid_field", "`queues` must be a list of names and `fingerprint` an object.")
    _hardware_of(key, queues)
    existing = Runner.objects.filter(hostname=hostname).select_related("key").first()
    if existing is not None and existing.key is not None and existing.key != key and existing.key.revoked_at is None:
        raise Refused(403, "registered_elsewhere", f"worker {hostname} is registered with another runner key; "
                                                   "revoke that key first or start this worker under another name.")
    orphaned = runs_fail_held_by(worker=hostname)
    if orphaned:
        log.warning("%s restarted holding %d run(s); marked failed: %s", hostname, len(orphaned), orphaned)
    runner = runner_register(hostname=hostname, queues=queues, fingerprint=fingerprint, key=key)
    return {"hardware": runner.hardware, "failed_runs": orphaned}


@endpoint("POST")
def heartbeat(request: HttpRequest, key: RunnerKey, body: dict[str, Any]) -> dict[str, Any]:
    hostname = _bound(key, _text(body, "hostname", limit=200))
    executing = body.get("executing")
    if not isinstance(executing, list):
        raise Refused(400, "invalid_field", "`executing` must be a list of run ids (UUIDs).")
    try:
        runs = {str(id_bounded(run, what="each of `executing`")) for run in executing}
    except InputRejected as exc:
        raise Refused(400, exc.code, exc.message) from None
    runner_heartbeat(hostname=hostname)
    runs_heartbeat(worker=hostname, executing=runs)
    return {"ok": True}


@endpoint("POST")
def stopped(request: HttpRequest, key: RunnerKey, body: dict[str, Any]) -> dict[str, Any]:
    runner_stopped(hostname=_bound(key, _text(body, "hostname", limit=200)))
    return {"ok": True}


@endpoint("POST")
def calibration(request: HttpRequest, key: RunnerKey, body: dict[str, Any]) -> dict[str, Any]:
    document = body.get("calibration")
    verdict = document.get("verdict") if isinstance(document, dict) else None
    if not (isinstance(verdict, dict) and isinstance(verdict.get("billable"), bool)
            and isinstance(verdict.get("message"), str) and isinstance(document.get("profile"), str)):
        # Checked before it is stored: a stored verdict of another shape failed every later result
        # of the runner (a red team, 2026-12-06).
        raise Refused(400, "invalid_field", "`calibration` must be a dyno.calibration/1 object: a `profile` string and "
                                            "a `verdict` object with `billable` (true or false) and `message`.")
    runner_calibration_record(hostname=_bound(key, _text(body, "hostname", limit=200)), calibration=document)
    return {"ok": True}


urlpatterns = [
    path("runs/<uuid:run_id>/claim", claim, name="claim"),
    path("runs/<uuid:run_id>/progress", progress, name="progress"),
    path("runs/<uuid:run_id>/log", log_line, name="log"),
    path("runs/<uuid:run_id>/succeed", succeed, name="succeed"),
    path("runs/<uuid:run_id>/fail", fail, name="fail"),
    path("runs/<uuid:run_id>/files/<path:name>", model_file, name="model-file"),
    path("workers/register", register, name="register"),
    path("workers/heartbeat", heartbeat, name="heartbeat"),
    path("workers/stopped", stopped, name="stopped"),
    path("workers/calibration", calibration, name="calibration"),
]
