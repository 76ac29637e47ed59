"""The runner fleet: each Celery worker registers its hardware class and device fingerprint."""

from __future__ import annotations

from datetime import timedelta
from functools import cached_property

from django.conf import settings
from django.db import models
from django.utils import timezone


def calibration_judged(calibration: dict) -> tuple[bool, str]:
    """The platform's reading of a posted calibration: billable only where the runner's verdict says
    so and its rows agree (at least one workload, every A/A control stable, the baseline accepted
    against itself on each). A verdict of "billable" over no rows, or over unstable ones, is the
    runner's word alone; the message says which."""
    verdict = calibration.get("verdict") if isinstance(calibration.get("verdict"), dict) else {}
    message = str(verdict.get("message") or "")
    if verdict.get("billable") is not True:
        return False, message
    rows = calibration.get("workloads")
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
        return False, "the runner's calibration said billable but holds no workload rows: not taken"
    bad = [str(r.get("key")) for r in rows if r.get("stable") is not True or r.get("baseline_verdict") != "accepted"]
    if bad:
        return False, f"the runner's calibration said billable over rows that are not ({', '.join(bad[:5])}): not taken"
    return True, message


class Runner(models.Model):
    hostname = models.CharField(max_length=200, unique=True)
    hardware = models.CharField(max_length=32, db_index=True)
    queues = models.JSONField(default=list)
    fingerprint = models.JSONField(default=dict)
    fingerprint_sha256 = models.CharField(max_length=64, blank=True)
    registered_at = models.DateTimeField()
    last_heartbeat = models.DateTimeField()
    stopped_at = models.DateTimeField(null=True, blank=True)
    # The runner's own A/A calibration (runners.calibrate, dyno.calibration/1), run when it starts;
    # a report measured on a runner whose calibration failed does not bill.
    calibration = models.JSONField(null=True, blank=True)
    calibrated_at = models.DateTimeField(null=True, blank=True)
    # The runner key it registered with: only that key acts for this worker (its runs, heartbeats).
    key = models.ForeignKey("RunnerKey", null=True, blank=True, on_delete=models.PROTECT, related_name="runners")

    class Meta:
        ordering = ["hardware", "hostname"]

    def __str__(self) -> str:
        return self.hostname

    @cached_property
    def _calibration_judged(self) -> tuple[bool | None, str]:
        """(billable, message) once calibrated; (None, "") while never calibrated (or it is off)."""
        if not isinstance(self.calibration, dict):
            return None, ""
        return calibration_judged(self.calibration)

    @property
    def calibration_billable(self) -> bool | None:
        return self._calibration_judged[0]

    @property
    def calibration_message(self) -> str:
        return self._calibration_judged[1]

    @property
    def online(self) -> bool:
        if self.stopped_at and self.stopped_at >= self.last_heartbeat:
            return False
        horizon = timedelta(seconds=3 * settings.DYNO_HEARTBEAT_SECONDS)
        return timezone.now() - self.last_heartbeat < horizon


class RunnerKey(models.Model):
    """A runner host's credential for the control API (fleet.control_api): the only thing a runner
    holds besides the broker's address. Scoped to hardware classes; only its SHA-256 is stored; an
    operator creates and revokes it with `manage.py runner_key`."""

    name = models.CharField(max_length=100, unique=True)
    token_sha256 = models.CharField(max_length=64, unique=True)
    hardware = models.JSONField(default=list)  # the hardware classes whose runs it may take
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def serves(self, hardware: str) -> bool:
        return self.revoked_at is None and hardware in self.hardware
