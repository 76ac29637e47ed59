"""Runs: one model version measured on one hardware class, with its stage, progress and log."""

from __future__ import annotations

import uuid

from django.db import models

from accounts.models import Organization
from catalog.models import ModelVersion
from runs.status import Stage, Status


class RunKind(models.TextChoices):
    MODEL = "model"  # profile, optimize and audit an uploaded model version
    AUDIT = "audit"  # audit one submitted candidate module for a suite workload (bring your own kernel)


class Run(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey(Organization, on_delete=models.PROTECT, related_name="runs")
    kind = models.CharField(max_length=8, choices=RunKind.choices, default=RunKind.MODEL)
    model_version = models.ForeignKey(ModelVersion, null=True, blank=True, on_delete=models.PROTECT,
                                      related_name="runs")
    # For audits: the suite workload and the candidate module, kept verbatim (it is evidence).
    workload = models.CharField(max_length=32, blank=True)
    candidate_source = models.TextField(blank=True)
    candidate_sha256 = models.CharField(max_length=64, blank=True)
    verdict = models.CharField(max_length=16, blank=True)  # an audit's overall verdict
    hardware = models.CharField(max_length=32)
    profile = models.CharField(max_length=32, default="cpu-ci")
    batch = models.PositiveIntegerField(default=1)
    seq = models.PositiveIntegerField(default=32)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED, db_index=True)
    stage = models.CharField(max_length=16, choices=Stage.choices, default=Stage.WAITING)
    progress = models.FloatField(default=0.0)
    error = models.TextField(blank=True)
    created_by = models.CharField(max_length=254, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    worker = models.CharField(max_length=200, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    inventory = models.JSONField(null=True, blank=True)
    # Stored together with status=succeeded in one transaction (runs.services.run_succeed).
    result = models.JSONField(null=True, blank=True)  # dyno.suite-result/1 plus the model-level figure
    artifact = models.JSONField(null=True, blank=True)  # dyno.optimization-artifact/1
    artifact_sha256 = models.CharField(max_length=64, blank=True)
    # A re-audit's run: the run it measures again (a model run replays that run's artifact).
    repeat_of = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT, related_name="repeats")
    model_speedup = models.FloatField(null=True, blank=True)
    model_ci_low = models.FloatField(null=True, blank=True)
    model_ci_high = models.FloatField(null=True, blank=True)
    stable = models.BooleanField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(condition=models.Q(progress__gte=0) & models.Q(progress__lte=1),
                                   name="run_progress_0_1"),
            models.CheckConstraint(condition=models.Q(status__in=Status.values), name="run_status_known"),
            models.CheckConstraint(
                condition=(models.Q(kind=RunKind.MODEL, model_version__isnull=False)
                           | (models.Q(kind=RunKind.AUDIT) & ~models.Q(workload="") & ~models.Q(candidate_source=""))),
                name="run_kind_has_its_subject"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} run {self.id} ({self.status})"

    @property
    def subject(self) -> str:
        return str(self.model_version) if self.kind == RunKind.MODEL else f"{self.workload} candidate"

    @property
    def finished(self) -> bool:
        return self.status in (Status.SUCCEEDED, Status.FAILED, Status.CANCELLED)


class RunEvent(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField(auto_now_add=True)
    level = models.CharField(max_length=8, default="info")
    stage = models.CharField(max_length=16, blank=True)
    message = models.TextField()

    class Meta:
        ordering = ["at", "id"]


class WorkloadResult(models.Model):
    """One audited workload of a run (or the model end to end), as the harness judged it."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="workload_results")
    name = models.CharField(max_length=64)
    family = models.CharField(max_length=32)
    shape = models.JSONField(default=dict)
    dtype = models.CharField(max_length=16)
    count = models.PositiveIntegerField(default=1)  # how often the model executes it
    weight = models.FloatField(default=0.0)  # share of the model's eager time
    baseline_median_s = models.FloatField(null=True)
    candidate_median_s = models.FloatField(null=True)
    speedup = models.FloatField(null=True)
    ci_low = models.FloatField(null=True)
    ci_high = models.FloatField(null=True)
    verdict = models.CharField(max_length=16)
    reasons = models.JSONField(default=list)
    reference_points = models.JSONField(default=dict)
    candidate_sha256 = models.CharField(max_length=64, blank=True)
    is_model = models.BooleanField(default=False)  # the whole model's forward pass

    class Meta:
        ordering = ["-is_model", "-weight", "name"]
