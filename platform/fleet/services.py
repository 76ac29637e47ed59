"""Runner registration, heartbeats and queue depths."""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.utils import timezone

from fleet.fingerprints import fingerprint_digest
from fleet.models import Runner, RunnerKey, calibration_judged

log = logging.getLogger(__name__)


def runner_register(*, hostname: str, queues: list[str], fingerprint: dict[str, Any],
                    key: RunnerKey | None = None) -> Runner:
    hardware_queues = [q for q in queues if q in settings.DYNO_HARDWARE_CLASSES]
    hardware = hardware_queues[0] if hardware_queues else (queues[0] if queues else "control")
    now = timezone.now()
    runner, _ = Runner.objects.update_or_create(
        hostname=hostname,
        defaults={"hardware": hardware, "queues": queues, "fingerprint": fingerprint,
                  "fingerprint_sha256": fingerprint_digest(fingerprint), "registered_at": now,
                  "last_heartbeat": now, "stopped_at": None, "key": key,
                  # A calibration belongs to one start of the runner (registration happens only
                  # then): a restarted runner, perhaps on other hardware or with its calibration
                  # off, measures uncalibrated until it posts a new one.
                  "calibration": None, "calibrated_at": None},
    )
    log.info("runner %s registered for %s", hostname, hardware)
    return runner


def runner_calibration_record(*, hostname: str, calibration: dict[str, Any]) -> None:
    """Store a runner's calibration (what `runners.calibrate` returned) and say so in the log."""
    updated = Runner.objects.filter(hostname=hostname).update(calibration=calibration, calibrated_at=timezone.now())
    billable, message = calibration_judged(calibration)
    (log.info if billable else log.warning)("runner %s calibration on %s: %s", hostname, calibration.get("profile"), message)
    if not updated:
        log.warning("runner %s is not registered; its calibration was not stored", hostname)


def runner_calibration_summary(*, hostname: str) -> dict[str, Any] | None:
    """What a result records of the runner that measured it: its calibration verdict, or None
    when the runner has none (calibration off, or not finished)."""
    runner = Runner.objects.filter(hostname=hostname).only("calibration", "calibrated_at").first()
    if runner is None or not isinstance(runner.calibration, dict):
        return None
    calibration = runner.calibration
    billable, message = calibration_judged(calibration)
    return {"billable": billable,
            "profile": calibration.get("profile"), "message": message,
            "summary": calibration.get("summary"),
            "calibrated_at": runner.calibrated_at.isoformat() if runner.calibrated_at else None}


def uncalibrated_summary() -> dict[str, Any]:
    """What a result records of a runner with no calibration stored, where the platform requires
    one (DYNO_REQUIRE_RUNNER_CALIBRATION): a failed calibration, saying why."""
    return {"billable": False, "profile": None, "summary": None, "calibrated_at": None,
            "message": "this platform holds no calibration of the runner that measured this (it is off, "
                       "had not finished, or never arrived): its figures do not bill until it passes one"}


def runner_heartbeat(*, hostname: str) -> None:
    Runner.objects.filter(hostname=hostname).update(last_heartbeat=timezone.now())


def runner_stopped(*, hostname: str) -> None:
    Runner.objects.filter(hostname=hostname).update(stopped_at=timezone.now())


def queue_depths(queues: list[str]) -> dict[str, int | None]:
    """Messages waiting per queue, read from the broker; None where the broker would not say."""
    from dyno.celery import app

    depths: dict[str, int | None] = {}
    try:
        with app.connection_for_read() as connection:
            channel = connection.default_channel
            for queue in queues:
                try:
                    depths[queue] = channel.queue_declare(queue=queue, passive=True).message_count
                except Exception:  # the queue was never declared: nothing has been sent to it
                    depths[queue] = 0
    except Exception as exc:
        log.warning("could not read queue depths from the broker: %s", exc)
        depths = {queue: None for queue in queues}
    return depths
