"""Runner chores: the calibration a runner runs on itself when it starts. Imported by Celery's task
autodiscovery, which is also how the worker hooks (fleet.worker) get connected. Runner side: no
database, the outcome goes to the control API."""

from __future__ import annotations

import logging
import re
import secrets
from pathlib import Path
from typing import Callable

from celery import shared_task
from django.conf import settings

from fleet import worker  # noqa: F401

log = logging.getLogger(__name__)

CALIBRATE = "fleet.calibrate"


def calibration_profile(hardware: str) -> str | None:
    """The profile a runner of `hardware` calibrates on (DYNO_RUNNER_CALIBRATION): `auto` takes
    `gpu` on a GPU class and `cpu-ci` on CPU; `off` (or empty) calibrates nothing."""
    choice = (settings.DYNO_RUNNER_CALIBRATION or "off").strip()
    if choice == "off":
        return None
    if choice == "auto":
        return "gpu" if hardware.startswith("gpu") else "cpu-ci"
    return choice


def calibration_workloads() -> list[str] | None:
    return [w for w in settings.DYNO_RUNNER_CALIBRATION_WORKLOADS.split(",") if w] or None


# One start of a runner, on its host: the worker's main process writes a fresh token when it
# registers (`begin_start`), and whichever of its pool processes calibrates first (the queued
# calibration task, or a run that found none: runs.runner) writes the same token once its
# verdict is posted. A run measures only after its runner's calibration of this start, so a run
# consumed before the calibration task is not measured uncalibrated (until 2026-12-06 it was, and
# its report did not bill: a lever for a payer who can time a run after a restart).
def _state_file(hostname: str, kind: str) -> Path:
    safe = re.sub(r"[^A-Za-z0-9_.@-]", "_", hostname)[:200]
    return Path(settings.VAR_DIR) / "runner-starts" / f"{safe}.{kind}"


def _write(path: Path, token: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(path.name + ".new")
    staging.write_text(token)
    staging.replace(path)


def begin_start(hostname: str) -> str:
    token = secrets.token_hex(16)
    _write(_state_file(hostname, "start"), token)
    return token


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def calibrated_this_start(hostname: str) -> bool:
    """Whether this start of `hostname` has posted its calibration. A process that never began a
    start here (an eager call, a worker that is not a runner) has none to wait for."""
    start = _read(_state_file(hostname, "start"))
    return start is None or _read(_state_file(hostname, "calibrated")) == start


def calibrate_and_post(profile: str, workloads: list[str] | None, hardware: str, hostname: str) -> dict:
    """A/A audits of `profile` on this worker, the verdict posted to the platform for its Runner row
    and this start marked calibrated. The caller holds the device lock."""
    from fleet.control_client import ControlClient
    from runners.calibrate import calibrate
    from runs.runner import device_for

    start = _read(_state_file(hostname, "start"))
    try:
        document = calibrate(profile, workloads=workloads, device=device_for(hardware))
    except Exception as exc:  # a calibration that cannot run is a failed calibration, said plainly
        log.exception("runner %s: calibration on %s could not run", hostname, profile)
        document = {"schema": "dyno.calibration/1", "profile": profile, "workloads": [], "summary": {},
                    "verdict": {"billable": False, "message": f"calibration could not run: {exc}"[:500]}}
    ControlClient().calibration(hostname=hostname, calibration=document)
    if start is not None:
        _write(_state_file(hostname, "calibrated"), start)
    return document


@shared_task(name=CALIBRATE, bind=True, acks_late=False, ignore_result=True,
             soft_time_limit=3600, time_limit=3660)
def runner_calibrate(self, profile: str, workloads: list[str] | None = None, hardware: str = "cpu") -> None:
    """A/A audits on this very worker (sent to its own direct queue), its verdict handed to the
    platform for its Runner row. Takes the device lock, so it never measures beside a run on the
    same device; a run that found no calibration of this start has calibrated already."""
    from runs.runner import device_for, device_lock

    hostname = self.request.hostname
    with device_lock(device_for(hardware)):
        if calibrated_this_start(hostname):
            log.info("runner %s: calibrated already in this start (by the first run it took)", hostname)
            return
        calibrate_and_post(profile, workloads, hardware, hostname)


def calibrate_before_measuring(hardware: str, hostname: str, note: Callable[[str], None]) -> bool:
    """Called by a run holding the device lock: a runner that calibrates (DYNO_RUNNER_CALIBRATION)
    but has not yet in this start calibrates now, before the run is measured. True if it did."""
    profile = calibration_profile(hardware) if hardware in settings.DYNO_HARDWARE_CLASSES else None
    if profile is None or calibrated_this_start(hostname):
        return False
    note(f"calibrating this runner on {profile} before it measures: it started moments ago and has not yet")
    calibrate_and_post(profile, calibration_workloads(), hardware, hostname)
    return True
