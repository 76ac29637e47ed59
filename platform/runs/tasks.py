"""Celery interface of runs: take an id, call the pure profiler in runners/, store the result.

The task is safe to deliver twice: the claim is a conditional update, so a duplicate finds the
run no longer queued and returns.
"""

from __future__ import annotations

import logging
import socket

import torch
from celery import shared_task
from celery.exceptions import SoftTimeLimitExceeded

from catalog.services import version_path
from runs.models import Run
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


def worker_name() -> str:
    from celery import current_task

    request = getattr(current_task, "request", None)
    return getattr(request, "hostname", None) or socket.gethostname()


def device_for(hardware: str) -> str:
    return "cuda" if hardware.startswith("gpu") and torch.cuda.is_available() else "cpu"


@shared_task(name="runs.execute", acks_late=True, soft_time_limit=3600, time_limit=3900)
def run_execute(run_id: str) -> None:
    worker = worker_name()
    if not run_claim(run_id=run_id, worker=worker):
        log.info("run %s is not queued any more; nothing to do", run_id)
        return
    run = Run.objects.select_related("model_version").get(pk=run_id)
    try:
        from runners.profile import profile_model

        def progress(fraction: float, message: str) -> None:
            run_progress(run_id=run_id, worker=worker, fraction=0.95 * fraction, message=message,
                         stage=Stage.PROFILE)

        inventory = profile_model(version_path(run.model_version), batch=run.batch, seq=run.seq,
                                  device=device_for(run.hardware), progress=progress)
        run_progress(run_id=run_id, worker=worker, fraction=0.97, message="storing results", stage=Stage.STORE)
        if not run_succeed(run_id=run_id, worker=worker, inventory=inventory):
            log.info("run %s finished but was cancelled or taken meanwhile; result dropped", run_id)
    except RunCancelled:
        run_log(run_id, "stopped: the run was cancelled", level="warning")
    except SoftTimeLimitExceeded:
        run_fail(run_id=run_id, worker=worker, error="the run exceeded its time limit")
    except Exception as exc:  # the model, not the platform, is the usual cause: tell the customer
        log.exception("run %s failed", run_id)
        run_fail(run_id=run_id, worker=worker, error=f"{type(exc).__name__}: {exc}")


@shared_task(name="runs.reap_stale")
def reap_stale() -> list[str]:
    return runs_reap_stale()
