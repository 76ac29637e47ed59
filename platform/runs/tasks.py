"""Celery interface of runs: take an id, call the pure pipeline in runners/, store the result.

Safe to deliver twice: the claim is a conditional update, so a duplicate finds the run no longer
queued and returns. One device measures one thing at a time (a lock per device). Time limits come
from settings, per stage (runs.limits) and for the whole run: past a soft limit the run fails
naming its stage; past a hard one the pool process is killed and the run is failed, by the stage
clock or by the worker's main process (`run_execute_failed`). Only
transient infrastructure errors (database or broker unreachable) are retried, a bounded number
of times; a measurement already made is stored again, never measured again.
"""

from __future__ import annotations

import fcntl
import logging
import socket
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

import kombu.exceptions
import torch
from billiard.exceptions import TimeLimitExceeded, WorkerLostError
from celery import shared_task
from celery.exceptions import SoftTimeLimitExceeded
from celery.signals import task_failure, worker_ready
from django.conf import settings
from django.db import InterfaceError, OperationalError, connection

from dyno.dispatch import RUN_EXECUTE
from runs.limits import StageClock
from runs.models import Run, RunKind
from runs.services import (
    RunCancelled,
    run_claim,
    run_fail,
    run_log,
    run_progress,
    run_succeed,
    runs_reap_stale,
    runs_resend_unclaimed,
)
from runs.status import FINISHED, Stage, Status
from runners.fingerprint import gpu_uuid
from runners.redact import exception_text

log = logging.getLogger(__name__)

T = TypeVar("T")
EXECUTE = RUN_EXECUTE
# The database or the broker went away for a moment (a restart, a failover): worth another try.
TRANSIENT = (OperationalError, InterfaceError, kombu.exceptions.OperationalError)


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


def check_fingerprint(worker: str, device: str) -> None:
    from fleet.models import Runner
    from fleet.services import fingerprint_digest
    from runners.fingerprint import environment_fingerprint

    runner = Runner.objects.filter(hostname=worker).first()
    if runner is None:
        return  # not a registered runner (e.g. an eager test call): nothing to compare with
    now = fingerprint_digest(environment_fingerprint(device))
    if now != runner.fingerprint_sha256:
        raise DeviceChanged(f"the device fingerprint of {worker} changed since it registered (driver or "
                            "library update?); restart the worker so it re-registers before it measures.")


# --- time limits and retries --------------------------------------------------------------------


def time_limit_error(stage: str, *, seconds: int, hard: bool = False, per_stage: bool = False) -> str:
    """What a run that ran out of time says, for the customer and the operator alike."""
    setting = ("DYNO_STAGE_TIME_LIMITS" if per_stage
               else "DYNO_RUN_HARD_TIME_LIMIT_SECONDS" if hard else "DYNO_RUN_SOFT_TIME_LIMIT_SECONDS")
    what = f"stage {stage} exceeded" if per_stage else f"the run, in stage {stage}, exceeded"
    if hard:
        return f"{what} the hard time limit of {seconds} s and its process was killed ({setting})."
    return (f"{what} its time limit of {seconds} s ({setting}); the run was stopped. Start it with a "
            "smaller batch or sequence, or ask an operator to raise the limit.")


def backoff_seconds(attempt: int) -> float:
    """1, 2, 4, 8 ... seconds, at most 30: long enough for a database or broker restart."""
    return min(30.0, 2.0 ** attempt)


def with_retries(action: Callable[[], T], *, what: str, run_id: str, attempts: int | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> T:
    """`action` again after a transient error, up to DYNO_RUN_TRANSIENT_RETRIES more times.

    For writes that are safe to repeat (conditional updates in one transaction): a commit whose
    acknowledgement was lost finds the run already moved and changes nothing the second time.
    """
    attempts = settings.DYNO_RUN_TRANSIENT_RETRIES if attempts is None else attempts
    for attempt in range(attempts + 1):
        try:
            return action()
        except TRANSIENT as exc:
            if attempt >= attempts:
                raise
            log.warning("run %s: %s failed (%s: %s); retry %d of %d", run_id, what, type(exc).__name__, exc,
                        attempt + 1, attempts)
            connection.close()  # a broken connection stays broken; the next query opens a new one
            sleep(backoff_seconds(attempt))
    raise AssertionError("unreachable")


@dataclass
class RunState:
    """What the task knows without asking the database (which may be the thing that is down)."""

    stage: str = Stage.PROFILE


# --- executing ----------------------------------------------------------------------------------


def _execute_model(run: Run, device: str, progress) -> dict:
    from catalog.services import version_path
    from pipeline.model_run import run_model_pipeline

    # A re-audit measures the artifact its original run measured, not whatever tuning picks today.
    replay = run.repeat_of.artifact if run.repeat_of_id is not None else None
    outcome = run_model_pipeline(version_path(run.model_version), batch=run.batch, seq=run.seq,
                                 profile=run.profile, device=device, progress=progress,
                                 tuning_cache=Path(settings.DYNO_TUNING_CACHE),
                                 workload_limit=settings.DYNO_RUN_WORKLOAD_LIMIT,
                                 tune_budget_s=settings.DYNO_TUNE_BUDGET_SECONDS, replay=replay,
                                 try_compile=settings.DYNO_OPTIMIZER_WHOLE_MODEL_COMPILE)
    run_log(run.pk, "stage seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in outcome.seconds.items()))
    return {"inventory": outcome.inventory, "result": outcome.result, "artifact": outcome.artifact}


def _record_runner_calibration(outcome: dict, worker: str) -> None:
    """The result says how the runner that measured it calibrated (a failed calibration: no bill)."""
    from fleet.services import runner_calibration_summary

    result = outcome.get("result")
    summary = runner_calibration_summary(hostname=worker)
    if isinstance(result, dict) and summary is not None:
        result.setdefault("environment", {})["runner_calibration"] = summary


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


def _execute_audit(run: Run, device: str, progress) -> dict:
    from runners.evaluate import audit_candidate

    protocol, config = audit_limits(run.profile, device)
    progress(0.0, f"auditing the {run.workload} candidate under profile {run.profile}", Stage.AUDIT)
    result = audit_candidate(run.workload, run.candidate_source, profile=run.profile, device=device,
                             progress=lambda f, m: progress(0.95 * f, m, Stage.AUDIT), label="submitted candidate",
                             protocol=protocol, sandbox_config=config)
    return {"result": result}


def _claim(task, run_id: str, worker: str) -> bool:
    """Claim the run; a database that is away gets the whole delivery retried later (nothing started)."""
    try:
        if run_claim(run_id=run_id, worker=worker):
            return True
        # A retry whose earlier claim committed but lost its acknowledgement finds the run ours.
        return task.request.retries > 0 and Run.objects.filter(
            pk=run_id, status=Status.RUNNING, worker=worker).exists()
    except TRANSIENT as exc:
        connection.close()
        retries = task.request.retries
        log.warning("run %s: claim failed (%s); delivery retry %d of %d", run_id, exc, retries + 1,
                    settings.DYNO_RUN_TRANSIENT_RETRIES)
        raise task.retry(exc=exc, countdown=backoff_seconds(retries),
                         max_retries=settings.DYNO_RUN_TRANSIENT_RETRIES) from None


@shared_task(name=EXECUTE, bind=True, acks_late=True,
             soft_time_limit=settings.DYNO_RUN_SOFT_TIME_LIMIT_SECONDS,
             time_limit=settings.DYNO_RUN_HARD_TIME_LIMIT_SECONDS)
def run_execute(self, run_id: str) -> None:
    worker = worker_name()
    if not _claim(self, run_id, worker):
        log.info("run %s is not queued any more; nothing to do", run_id)
        return
    state = RunState()

    def fail_hard(stage: str, seconds: int) -> None:  # from the stage clock's watchdog thread
        try:
            run_fail(run_id=run_id, worker=worker, error=time_limit_error(stage, seconds=seconds, hard=True,
                                                                         per_stage=True))
        finally:
            connection.close()

    clock = StageClock(settings.DYNO_STAGE_TIME_LIMITS, on_hard=fail_hard)

    def progress(fraction: float, message: str, stage: str) -> None:
        state.stage = stage or state.stage
        clock.enter(state.stage)
        clock.check()
        try:
            run_progress(run_id=run_id, worker=worker, fraction=fraction, message=message, stage=stage)
        except TRANSIENT as exc:  # progress is advisory: measuring goes on, the store retries
            log.warning("run %s: progress not recorded (%s)", run_id, exc)
            connection.close()

    def fail(error: str) -> None:
        try:
            with_retries(lambda: run_fail(run_id=run_id, worker=worker, error=error), what="fail", run_id=run_id)
        except TRANSIENT:
            log.exception("run %s: could not record its failure (%s); the reaper will", run_id, error)

    try:
        with clock:
            run = Run.objects.select_related("model_version").get(pk=run_id)
            state.stage = Stage.AUDIT if run.kind == RunKind.AUDIT else Stage.PROFILE
            clock.enter(state.stage)
            device = device_for(run.hardware)
            with device_lock(device):
                check_fingerprint(worker, device)
                execute = _execute_audit if run.kind == RunKind.AUDIT else _execute_model
                outcome = execute(run, device, progress)
            _record_runner_calibration(outcome, worker)
            progress(0.97, "storing results", Stage.STORE)
            stored = with_retries(lambda: run_succeed(run_id=run_id, worker=worker, **outcome), what="store",
                                  run_id=run_id)
        if not stored:
            log.info("run %s finished but was cancelled or taken meanwhile; result dropped", run_id)
    except RunCancelled:
        run_log(run_id, "stopped: the run was cancelled", level="warning")
    except SoftTimeLimitExceeded:
        connection.close()  # the limit may have interrupted a query; start the failure on a fresh one
        if clock.expired:
            stage, seconds = clock.expired
            fail(time_limit_error(stage, seconds=seconds, per_stage=True))
        else:
            fail(time_limit_error(state.stage, seconds=settings.DYNO_RUN_SOFT_TIME_LIMIT_SECONDS))
    except DeviceChanged as exc:
        log.error("run %s refused: %s", run_id, exc)
        fail(str(exc))
    except TRANSIENT as exc:  # still unreachable after every retry: ours to fix, not the customer's
        log.exception("run %s: infrastructure unavailable in stage %s", run_id, state.stage)
        fail(f"the platform lost its database or broker in stage {state.stage} ({type(exc).__name__}); "
             "nothing is wrong with the submission: start it again.")
    except Exception as exc:  # the model, not the platform, is the usual cause: tell the customer
        log.exception("run %s failed", run_id)
        fail(exception_text(exc))  # in the exception's words, without the server's paths or addresses


def run_execute_failed(*, run_id: str, exception: BaseException, worker: str | None = None) -> bool:
    """Fail a run whose task ended outside its own handlers; True if this moved it.

    Runs in the worker's main process for a hard time limit or a pool process that died (killed,
    out of memory), where the task's own `except` never ran: without this the worker's heartbeat
    would keep the run `running` for good. A run another worker holds (this was a duplicate
    delivery) is left alone.
    """
    run = Run.objects.filter(pk=run_id).only("status", "stage", "worker").first()
    if run is None or run.status in FINISHED:
        return False
    if run.status == Status.RUNNING and worker and run.worker != worker:
        return False
    if isinstance(exception, TimeLimitExceeded):
        error = time_limit_error(run.stage, seconds=settings.DYNO_RUN_HARD_TIME_LIMIT_SECONDS, hard=True)
    elif isinstance(exception, SoftTimeLimitExceeded):
        error = time_limit_error(run.stage, seconds=settings.DYNO_RUN_SOFT_TIME_LIMIT_SECONDS)
    elif isinstance(exception, WorkerLostError):
        error = (f"the worker process executing stage {run.stage} died ({exception}); "
                 "nothing was stored. Start the run again.")
    else:
        error = f"{type(exception).__name__}: {exception}"
    return run_fail(run_id=run_id, error=error, worker=run.worker if run.status == Status.RUNNING else None)


_this_worker: dict[str, str] = {}


@worker_ready.connect
def _remember_worker(sender=None, **kwargs) -> None:
    _this_worker["hostname"] = sender.hostname


@task_failure.connect
def _on_task_failure(sender=None, task_id=None, exception=None, args=None, **kwargs) -> None:
    if getattr(sender, "name", None) != EXECUTE or not args:
        return
    try:
        if run_execute_failed(run_id=str(args[0]), exception=exception, worker=_this_worker.get("hostname")):
            log.error("run %s failed outside its task (%s)", args[0], type(exception).__name__)
    except Exception:  # a signal handler must not take the worker's main loop down with it
        log.exception("could not fail run %s after %r", args[0], exception)


@shared_task(name="runs.reap_stale")
def reap_stale() -> list[str]:
    runs_resend_unclaimed()
    return runs_reap_stale()
