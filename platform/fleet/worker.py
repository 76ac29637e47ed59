"""Hooks that run inside a runner's Celery worker process: register, heartbeat, and say it stopped,
all through the control API (fleet.control_client): a runner holds no database credentials."""

from __future__ import annotations

import logging
import os
import threading

from celery.signals import worker_ready, worker_shutdown
from django.conf import settings

from fleet.control_client import ControlClient

log = logging.getLogger(__name__)
_stop = threading.Event()


def device_fingerprint(queues: list[str]) -> dict:
    from runners.fingerprint import environment_fingerprint
    from runs.runner import device_for

    gpu = any(device_for(q) == "cuda" for q in queues)
    return environment_fingerprint("cuda" if gpu else "cpu")


def executing_runs() -> set[str]:
    """Ids of the runs this worker's pool is executing now (the main process tracks its requests)."""
    from celery.worker import state

    return {str(request.args[0]) for request in list(state.active_requests)
            if request.name == "runs.execute" and request.args}


def _beat(hostname: str) -> None:
    control = ControlClient(attempts=0)  # the next beat is the retry
    while not _stop.wait(settings.DYNO_HEARTBEAT_SECONDS):
        try:
            control.heartbeat(hostname=hostname, executing=sorted(executing_runs()))
        except Exception:
            log.exception("heartbeat of %s failed; retrying next interval", hostname)


def gpu_binding_problem(queues: list[str], *, visible: str | None, device_count: int) -> str | None:
    """Why a worker may not start as it is: one that serves a GPU hardware class must see exactly
    one GPU (start one worker per GPU with CUDA_VISIBLE_DEVICES=N), so that two workers never
    share one and a worker's figures always come from the same device."""
    from runs.runner import device_for

    if not any(device_for(q) == "cuda" for q in queues):
        return None
    if device_count != 1:
        return (f"this worker serves {', '.join(q for q in queues if q.startswith('gpu'))} and sees {device_count} GPUs "
                f"(CUDA_VISIBLE_DEVICES={visible!r}): start one worker per GPU, e.g. "
                "`CUDA_VISIBLE_DEVICES=0 celery -A dyno worker -Q gpu-h200 -c 1 -n gpu0@%h`")
    return None


def compile_variants_problem(names: list[str]) -> str | None:
    """Why a runner may not start with DYNO_OPTIMIZER_COMPILE_VARIANTS as set: a name the optimizer
    does not know would fail every model run's optimize stage instead."""
    from runs.runner import unknown_compile_variants

    problem = unknown_compile_variants(names)
    return f"DYNO_OPTIMIZER_COMPILE_VARIANTS: {problem}" if problem else None


@worker_ready.connect
def on_worker_ready(sender=None, **kwargs) -> None:
    import torch

    hostname = sender.hostname
    queues = sorted(q.name for q in sender.app.amqp.queues.consume_from.values()) \
        if sender.app.amqp.queues.consume_from else []
    if not any(q in settings.DYNO_HARDWARE_CLASSES for q in queues):
        return  # a control worker measures nothing: not a runner
    problem = gpu_binding_problem(queues, visible=os.environ.get("CUDA_VISIBLE_DEVICES"),
                                  device_count=torch.cuda.device_count()) \
        or compile_variants_problem(settings.DYNO_OPTIMIZER_COMPILE_VARIANTS)
    if problem:
        # A receiver's exception would only be logged by Celery, and the worker would go on taking
        # runs: end the process instead (EX_CONFIG), before it registers or consumes anything.
        log.critical("%s refuses to serve: %s", hostname, problem)
        os._exit(78)
    # The platform fails whatever this name held (it died with the last process), then registers it.
    try:
        # Patient: a runner may start before the platform it reports to (make demo starts both).
        patient = ControlClient(attempts=max(settings.DYNO_RUN_TRANSIENT_RETRIES, 6))
        registered = patient.register(hostname=hostname, queues=queues, fingerprint=device_fingerprint(queues))
    except Exception as exc:
        # A runner the platform will not register (no key, a revoked one, out of its scope) must not
        # take runs it could never report: end the process (EX_CONFIG), saying why.
        log.critical("%s could not register with the platform at %s: %s", hostname, settings.DYNO_CONTROL_URL, exc)
        os._exit(78)
    if registered.get("failed_runs"):
        log.warning("%s restarted holding %d run(s); the platform failed them: %s", hostname,
                    len(registered["failed_runs"]), registered["failed_runs"])
    threading.Thread(target=_beat, args=(hostname,), name="dyno-heartbeat", daemon=True).start()
    _calibrate_self(hostname, registered.get("hardware", ""))


def _calibrate_self(hostname: str, hardware: str) -> None:
    """Ask this worker (its own direct queue: no other worker takes it) to calibrate itself."""
    from celery.utils.nodenames import worker_direct

    from fleet.tasks import begin_start, calibration_profile, calibration_workloads, runner_calibrate

    begin_start(hostname)  # before anything is consumed: no run of this start is measured uncalibrated
    profile = calibration_profile(hardware) if hardware in settings.DYNO_HARDWARE_CLASSES else None
    if profile is None:
        return
    workloads = calibration_workloads()
    try:
        runner_calibrate.apply_async(args=[profile, workloads, hardware], queue=worker_direct(hostname))
    except Exception:
        log.exception("%s: could not queue its calibration; it measures uncalibrated", hostname)


@worker_shutdown.connect
def on_worker_shutdown(sender=None, **kwargs) -> None:
    _stop.set()
    queues = [q.name for q in sender.app.amqp.queues.consume_from.values()] \
        if sender is not None and sender.app.amqp.queues.consume_from else []
    if sender is None or not any(q in settings.DYNO_HARDWARE_CLASSES for q in queues):
        return
    try:
        ControlClient(attempts=0).stopped(hostname=sender.hostname)
    except Exception:
        log.exception("could not mark %s stopped", getattr(sender, "hostname", "?"))
