"""The model catalog: a customer's models, their uploaded versions and every kept file's hash."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models

from accounts.models import Organization


class Model(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey(Organization, on_delete=models.PROTECT, related_name="models")
    name = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["organization", "name"], name="model_name_unique_in_org")]
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class VersionKind(models.TextChoices):
    WEIGHTS = "weights", "weights"
    CARD = "card", "architecture card"


class ModelVersion(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    model = models.ForeignKey(Model, on_delete=models.PROTECT, related_name="versions")
    number = models.PositiveIntegerField()
    kind = models.CharField(max_length=16, choices=VersionKind.choices)
    family = models.CharField(max_length=64)
    architecture = models.CharField(max_length=128)
    parameter_count = models.BigIntegerField()
    dtype = models.CharField(max_length=32)
    config = models.JSONField()
    storage_dir = models.CharField(max_length=500)
    total_bytes = models.BigIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    uploaded_by = models.CharField(max_length=254, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["model", "number"], name="version_number_unique")]
        ordering = ["-number"]

    def __str__(self) -> str:
        return f"{self.model.name} v{self.number}"

    @property
    def organization_id(self) -> int:
        return self.model.organization_id


class ModelFile(models.Model):
    version = models.ForeignKey(ModelVersion, on_delete=models.CASCADE, related_name="files")
    path = models.CharField(max_length=300)
    size = models.BigIntegerField()
    sha256 = models.CharField(max_length=64)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["version", "path"], name="file_path_unique_in_version")]
        ordering = ["path"]
