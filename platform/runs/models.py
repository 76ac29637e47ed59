"""Runs: one model version measured on one hardware class, with its stage, progress and log."""

from __future__ import annotations

import uuid

from django.db import models

from accounts.models import Organization
from catalog.models import ModelVersion
from runs.status import Stage, Status


class Run(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey(Organization, on_delete=models.PROTECT, related_name="runs")
    model_version = models.ForeignKey(ModelVersion, on_delete=models.PROTECT, related_name="runs")
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

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(condition=models.Q(progress__gte=0) & models.Q(progress__lte=1),
                                   name="run_progress_0_1"),
            models.CheckConstraint(condition=models.Q(status__in=Status.values), name="run_status_known"),
        ]

    def __str__(self) -> str:
        return f"run {self.id} ({self.status})"

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
