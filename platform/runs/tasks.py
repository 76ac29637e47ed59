"""Celery interface of runs: take an id, call the pure pipeline in runners/, store the result.

Safe to deliver twice: the claim is a conditional update, so a duplicate finds the run no longer
queued and returns. One device measures one thing at a time (a lock per device).
"""

from __future__ import annotations

import fcntl
import logging
import socket
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch
from celery import shared_task
from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings

from runs.models import Run, RunKind
from runs.services import (
    RunCancelled,
    run_claim,
    run_fail,
    run_log,
    run_progress,
    run_succeed,
    runs_reap_stale,
)
from runs.status import Stage

log = logging.getLogger(__name__)


class DeviceChanged(RuntimeError):
    """The device's fingerprint differs from what this worker registered (a driver update, say)."""


def worker_name() -> str:
    from celery import current_task

    request = getattr(current_task, "request", None)
    return getattr(request, "hostname", None) or socket.gethostname()


def device_for(hardware: str) -> str:
    return "cuda" if hardware.startswith("gpu") and torch.cuda.is_available() else "cpu"


@contextmanager
def device_lock(device: str) -> Iterator[None]:
    """Two workers on one host never measure on the same device at once (a file lock per device)."""
    index = torch.cuda.current_device() if device == "cuda" else 0
    path = Path(settings.VAR_DIR) / "locks" / f"{device}{index}.lock"
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


def _execute_model(run: Run, device: str, progress) -> dict:
    from catalog.services import version_path
    from runners.pipeline import run_model_pipeline

    outcome = run_model_pipeline(version_path(run.model_version), batch=run.batch, seq=run.seq,
                                 profile=run.profile, device=device, progress=progress,
                                 tuning_cache=Path(settings.DYNO_TUNING_CACHE),
                                 workload_limit=settings.DYNO_RUN_WORKLOAD_LIMIT,
                                 tune_budget_s=settings.DYNO_TUNE_BUDGET_SECONDS)
    run_log(run.pk, "stage seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in outcome.seconds.items()))
    return {"inventory": outcome.inventory, "result": outcome.result, "artifact": outcome.artifact}


def _execute_audit(run: Run, device: str, progress) -> dict:
    from runners.evaluate import audit_candidate

    result = audit_candidate(run.workload, run.candidate_source, profile=run.profile, device=device,
                             progress=lambda f, m: progress(0.95 * f, m, Stage.AUDIT), label="submitted candidate")
    return {"result": result}


@shared_task(name="runs.execute", acks_late=True, soft_time_limit=3600, time_limit=3900)
def run_execute(run_id: str) -> None:
    worker = worker_name()
    if not run_claim(run_id=run_id, worker=worker):
        log.info("run %s is not queued any more; nothing to do", run_id)
        return
    run = Run.objects.select_related("model_version").get(pk=run_id)
    device = device_for(run.hardware)

    def progress(fraction: float, message: str, stage: str) -> None:
        run_progress(run_id=run_id, worker=worker, fraction=fraction, message=message, stage=stage)

    try:
        with device_lock(device):
            check_fingerprint(worker, device)
            execute = _execute_audit if run.kind == RunKind.AUDIT else _execute_model
            outcome = execute(run, device, progress)
        progress(0.97, "storing results", Stage.STORE)
        if not run_succeed(run_id=run_id, worker=worker, **outcome):
            log.info("run %s finished but was cancelled or taken meanwhile; result dropped", run_id)
    except RunCancelled:
        run_log(run_id, "stopped: the run was cancelled", level="warning")
    except SoftTimeLimitExceeded:
        run_fail(run_id=run_id, worker=worker, error="the run exceeded its time limit")
    except DeviceChanged as exc:
        log.error("run %s refused: %s", run_id, exc)
        run_fail(run_id=run_id, worker=worker, error=str(exc))
    except Exception as exc:  # the model, not the platform, is the usual cause: tell the customer
        log.exception("run %s failed", run_id)
        run_fail(run_id=run_id, worker=worker, error=f"{type(exc).__name__}: {exc}")


@shared_task(name="runs.reap_stale")
def reap_stale() -> list[str]:
    return runs_reap_stale()
