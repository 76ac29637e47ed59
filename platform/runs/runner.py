"""The runner's Celery task: take a run's id, claim it from the control API, execute the pure
pipeline (pipeline/, runners/), hand the outcome back.

Runner hosts hold no database credentials (DYNO_ROLE=runner): everything this module learns or
stores goes through fleet.control_client, and the control API (fleet.control_api) alone writes it.
Safe to deliver twice: the claim is a conditional update on the platform, so a duplicate finds the
run no longer queued and returns. One device measures one thing at a time (a lock per device).
Time limits come from settings, per stage (runs.limits) and for the whole run: past a soft limit
the run fails naming its stage; past a hard one the pool process is killed and the run is failed,
by the stage clock or by the worker's main process (`_on_task_failure`). A platform that does not
answer is asked again a bounded number of times; a measurement already made is handed back again,
never measured again.
"""

from __future__ import annotations

import fcntl
import logging
import socket
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterator

import torch
from billiard.exceptions import TimeLimitExceeded, WorkerLostError
from celery import shared_task
from celery.exceptions import Reject, SoftTimeLimitExceeded
from celery.signals import task_failure, worker_ready
from django.conf import settings

from dyno.dispatch import RUN_EXECUTE
from fleet.control_client import ControlClient, ControlRefused, ControlUnavailable, RunNotHeld, backoff_seconds
from fleet.fingerprints import fingerprint_digest
from fleet.tasks import calibrate_before_measuring
from runs.limits import StageClock, time_limit_error
from runs.status import Stage
from runners.fingerprint import gpu_uuid
from runners.redact import exception_text

log = logging.getLogger(__name__)

EXECUTE = RUN_EXECUTE


class DeviceChanged(RuntimeError):
    """The device's fingerprint differs from what this worker registered (a driver update, say)."""


def worker_name() -> str:
    from celery import current_task

    request = getattr(current_task, "request", None)
    return getattr(request, "hostname", None) or socket.gethostname()


def device_for(hardware: str) -> str:
    return "cuda" if hardware.startswith("gpu") and torch.cuda.is_available() else "cpu"


def device_lock_name(device: str) -> str:
    """What a measurement locks on this host: the physical GPU (its UUID, whatever index this
    worker's CUDA_VISIBLE_DEVICES maps it to), or the CPU."""
    if device == "cuda":
        uuid = gpu_uuid(torch.cuda.current_device())
        return f"cuda-{uuid}" if uuid else f"cuda{torch.cuda.current_device()}"
    return "cpu0"


@contextmanager
def device_lock(device: str) -> Iterator[None]:
    """Two workers on one host never measure on the same device at once (a file lock per device)."""
    path = Path(settings.VAR_DIR) / "locks" / f"{device_lock_name(device)}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def check_fingerprint(worker: str, device: str, registered: str | None) -> None:
    """The device as it is now against what this worker registered when it started."""
    from runners.fingerprint import environment_fingerprint

    if not registered:
        return  # not a registered runner (e.g. an eager test call): nothing to compare with
    if fingerprint_digest(environment_fingerprint(device)) != registered:
        raise DeviceChanged(f"the device fingerprint of {worker} changed since it registered (driver or "
                            "library update?); restart the worker so it re-registers before it measures.")


@dataclass
class RunState:
    """What the task knows without asking the platform (which may be the thing that is down)."""

    stage: str = Stage.PROFILE


# --- executing ----------------------------------------------------------------------------------


def _execute_model(job: dict[str, Any], device: str, progress, *, worker: str, control: ControlClient) -> dict:
    from pipeline.model_run import run_model_pipeline

    progress(0.0, "fetching the model's files", Stage.PROFILE)
    folder = control.fetch_model(job["run_id"], worker=worker, files=job["model_files"], version=job["model_version"],
                                 cache=Path(settings.DYNO_RUNNER_CACHE))
    # A re-audit measures the artifact its original run measured, not whatever tuning picks today.
    outcome = run_model_pipeline(folder, batch=job["batch"], seq=job["seq"],
                                 profile=job["profile"], device=device, progress=progress,
                                 tuning_cache=Path(settings.DYNO_TUNING_CACHE),
                                 workload_limit=settings.DYNO_RUN_WORKLOAD_LIMIT,
                                 tune_budget_s=settings.DYNO_TUNE_BUDGET_SECONDS, replay=job.get("replay"),
                                 try_compile=settings.DYNO_OPTIMIZER_WHOLE_MODEL_COMPILE,
                                 compile_variants=settings.DYNO_OPTIMIZER_COMPILE_VARIANTS or None)
    control.log(job["run_id"], worker=worker,
                message="stage seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in outcome.seconds.items()))
    return {"inventory": outcome.inventory, "result": outcome.result, "artifact": outcome.artifact}


def unknown_compile_variants(names: list[str]) -> str | None:
    """What is wrong with these compile variant names for this runner's optimizer, or None."""
    from pipeline.model_run import unknown_compile_variants as check

    return check(names)


def audit_limits(profile: str, device: str) -> tuple[Any, Any]:
    """The protocol and sandbox limits an audit of a submitted candidate runs under (from settings).

    The memory limit is the sandbox's; the timeout setting only ever shortens the protocol's load
    and first-call timeouts, so a hanging candidate becomes a verdict well inside the run's limit.
    """
    from runners.measure import protocol_for
    from runners.sandbox import SandboxConfig

    config = SandboxConfig(device=device, memory_bytes=settings.DYNO_AUDIT_MEMORY_MIB << 20)
    cap = settings.DYNO_AUDIT_CALL_TIMEOUT_SECONDS
    if not cap:
        return None, config
    base = protocol_for(profile)
    protocol = replace(base, load_timeout_s=min(base.load_timeout_s, cap),
                       first_call_timeout_s=min(base.first_call_timeout_s, cap),
                       call_timeout_floor_s=min(base.call_timeout_floor_s, cap))
    return protocol, config


def _execute_audit(job: dict[str, Any], device: str, progress, **_: Any) -> dict:
    from runners.evaluate import audit_candidate

    protocol, config = audit_limits(job["profile"], device)
    progress(0.0, f"auditing the {job['workload']} candidate under profile {job['profile']}", Stage.AUDIT)
    result = audit_candidate(job["workload"], job["candidate_source"], profile=job["profile"], device=device,
                             progress=lambda f, m: progress(0.95 * f, m, Stage.AUDIT), label="submitted candidate",
                             protocol=protocol, sandbox_config=config)
    return {"result": result}


def _claim(task, control: ControlClient, run_id: str, worker: str) -> dict[str, Any] | None:
    """The run's claim from the platform, or None if it is not queued; a platform that is away gets
    the whole delivery retried later (nothing started)."""
    try:
        return control.claim(run_id, worker=worker, again=task.request.retries > 0)
    except RunNotHeld:
        return None
    except ControlUnavailable as exc:
        retries = task.request.retries
        log.warning("run %s: claim failed (%s); delivery retry %d of %d", run_id, exc, retries + 1,
                    settings.DYNO_RUN_TRANSIENT_RETRIES)
        raise task.retry(exc=exc, countdown=backoff_seconds(retries),
                         max_retries=settings.DYNO_RUN_TRANSIENT_RETRIES) from None
    except ControlRefused as exc:
        if exc.status not in (401, 403):
            raise
        # Its key was revoked (or no longer covers this worker): the run goes back to the queue for
        # another runner, and this worker stops taking runs it could never report.
        log.critical("%s: the platform refuses this runner (%s); returning run %s to its queue and shutting down",
                     worker, exc.message, run_id)
        try:
            task.app.control.shutdown(destination=[worker])
        except Exception:
            log.exception("%s: could not ask itself to shut down", worker)
        raise Reject(exc.message, requeue=True) from None


@shared_task(name=EXECUTE, bind=True, acks_late=True,
             soft_time_limit=settings.DYNO_RUN_SOFT_TIME_LIMIT_SECONDS,
             time_limit=settings.DYNO_RUN_HARD_TIME_LIMIT_SECONDS)
def run_execute(self, run_id: str) -> None:
    worker = worker_name()
    control = ControlClient()
    claim = _claim(self, control, run_id, worker)
    if claim is None:
        log.info("run %s is not queued any more; nothing to do", run_id)
        return
    job = claim["job"]
    state = RunState(stage=Stage.AUDIT if job["kind"] == "audit" else Stage.PROFILE)
    quick = ControlClient(attempts=1)  # progress is advisory: measuring goes on if it is not heard

    def fail_hard(stage: str, seconds: int) -> None:  # from the stage clock's watchdog thread
        try:
            quick.fail(run_id, worker=worker, error=time_limit_error(stage, seconds=seconds, hard=True, per_stage=True))
        except (ControlUnavailable, ControlRefused):
            log.exception("run %s: could not record its hard time limit; the reaper will", run_id)

    clock = StageClock(settings.DYNO_STAGE_TIME_LIMITS, on_hard=fail_hard)

    def progress(fraction: float, message: str, stage: str) -> None:
        state.stage = stage or state.stage
        clock.enter(state.stage)
        clock.check()
        try:  # RunNotHeld (cancelled, or taken meanwhile) ends the run's work where it stands
            quick.progress(run_id, worker=worker, fraction=fraction, message=message, stage=stage or "")
        except ControlUnavailable as exc:
            log.warning("run %s: progress not recorded (%s)", run_id, exc)

    def fail(error: str) -> None:
        try:
            control.fail(run_id, worker=worker, error=error)
        except (ControlUnavailable, ControlRefused):
            log.exception("run %s: could not record its failure (%s); the reaper will", run_id, error)

    try:
        with clock:
            clock.enter(state.stage)
            device = device_for(job["hardware"])
            with device_lock(device):
                check_fingerprint(worker, device, claim.get("registered_fingerprint_sha256"))
                if calibrate_before_measuring(job["hardware"], worker,
                                              lambda message: progress(0.01, message, state.stage)):
                    clock.restart()
                execute = _execute_audit if job["kind"] == "audit" else _execute_model
                outcome = execute(job, device, progress, worker=worker, control=control)
            progress(0.97, "storing results", Stage.STORE)
            stored = control.succeed(run_id, worker=worker, **outcome)
        if not stored:
            log.info("run %s finished but was cancelled or taken meanwhile; result dropped", run_id)
    except RunNotHeld:
        try:
            control.log(run_id, worker=worker, message="stopped: the run was cancelled", level="warning")
        except (ControlUnavailable, ControlRefused):
            log.warning("run %s: stopped (cancelled); the platform did not take the note", run_id)
    except SoftTimeLimitExceeded:
        if clock.expired:
            stage, seconds = clock.expired
            fail(time_limit_error(stage, seconds=seconds, per_stage=True))
        else:
            fail(time_limit_error(state.stage, seconds=settings.DYNO_RUN_SOFT_TIME_LIMIT_SECONDS))
    except DeviceChanged as exc:
        log.error("run %s refused: %s", run_id, exc)
        fail(str(exc))
    except ControlUnavailable as exc:  # still unreachable after every retry: the reaper fails the run
        log.exception("run %s: the platform is unreachable in stage %s (%s)", run_id, state.stage, exc)
        fail(f"the runner lost the platform in stage {state.stage}; nothing is wrong with the submission: "
             "start it again.")
    except Exception as exc:  # the model, not the platform, is the usual cause: tell the customer
        log.exception("run %s failed", run_id)
        fail(exception_text(exc))  # in the exception's words, without the server's paths or addresses


def outside_kind(exception: BaseException | None) -> str:
    """How a run's task ended outside its own handlers, as fleet.control_api's `fail` takes it."""
    if isinstance(exception, TimeLimitExceeded):
        return "hard_time_limit"
    if isinstance(exception, SoftTimeLimitExceeded):
        return "soft_time_limit"
    if isinstance(exception, WorkerLostError):
        return "worker_lost"
    return "other"


_this_worker: dict[str, str] = {}


@worker_ready.connect
def _remember_worker(sender=None, **kwargs) -> None:
    _this_worker["hostname"] = sender.hostname


@task_failure.connect
def _on_task_failure(sender=None, task_id=None, exception=None, args=None, **kwargs) -> None:
    """Runs in the worker's main process for a hard time limit or a pool process that died (killed,
    out of memory), where the task's own `except` never ran: without this the run would stay
    `running` until the reaper. The platform writes the message from the run's stage, and leaves
    alone a run another worker holds (this was a duplicate delivery)."""
    if getattr(sender, "name", None) != EXECUTE or not args:
        return
    kind = outside_kind(exception)
    detail = f"{type(exception).__name__}: {exception}" if kind == "other" else str(exception)
    try:
        if ControlClient(attempts=2).fail(str(args[0]), worker=_this_worker.get("hostname"), error=detail[:2000],
                                          outside=kind):
            log.error("run %s failed outside its task (%s)", args[0], type(exception).__name__)
    except Exception:  # a signal handler must not take the worker's main loop down with it
        log.exception("could not fail run %s after %r", args[0], exception)
