"""Runner chores: the calibration a runner runs on itself when it starts. Imported by Celery's task
autodiscovery, which is also how the worker hooks (fleet.worker) get connected. Runner side: no
database, the outcome goes to the control API."""

from __future__ import annotations

import logging

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


@shared_task(name=CALIBRATE, bind=True, acks_late=False, ignore_result=True,
             soft_time_limit=3600, time_limit=3660)
def runner_calibrate(self, profile: str, workloads: list[str] | None = None, hardware: str = "cpu") -> None:
    """A/A audits on this very worker (sent to its own direct queue), its verdict handed to the
    platform for its Runner row. Takes the device lock, so it never measures beside a run on the
    same device."""
    from fleet.control_client import ControlClient
    from runners.calibrate import calibrate
    from runs.runner import device_for, device_lock

    hostname = self.request.hostname
    device = device_for(hardware)
    with device_lock(device):
        try:
            document = calibrate(profile, workloads=workloads or None, device=device)
        except Exception as exc:  # a calibration that cannot run is a failed calibration, said plainly
            log.exception("runner %s: calibration on %s could not run", hostname, profile)
            document = {"schema": "dyno.calibration/1", "profile": profile, "workloads": [], "summary": {},
                        "verdict": {"billable": False, "message": f"calibration could not run: {exc}"[:500]}}
    ControlClient().calibration(hostname=hostname, calibration=document)
