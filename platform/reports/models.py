"""Signed speedup reports: the canonical JSON body exactly as signed, its signature and key.

A report is immutable once written; a re-audit makes a new report that supersedes the old one.
"""

from __future__ import annotations

import uuid

from django.db import models

from accounts.models import Organization
from runs.models import Run


class ReportKind(models.TextChoices):
    RUN = "run"
    AUDIT = "audit"
    REAUDIT = "reaudit"


class Report(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey(Organization, on_delete=models.PROTECT, related_name="reports")
    kind = models.CharField(max_length=16, choices=ReportKind.choices)
    run = models.ForeignKey(Run, null=True, blank=True, on_delete=models.PROTECT, related_name="reports")
    supersedes = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT,
                                   related_name="superseded_by")
    hardware = models.CharField(max_length=32)
    body = models.BinaryField()  # canonical JSON, the exact bytes that were signed
    body_sha256 = models.CharField(max_length=64, unique=True)
    key_id = models.CharField(max_length=64)
    signature = models.CharField(max_length=128)  # base64 Ed25519
    # Copied out of the body for queries and billing; the body stays the source of truth.
    model_speedup = models.DecimalField(max_digits=12, decimal_places=6, null=True)
    model_ci_low = models.DecimalField(max_digits=12, decimal_places=6, null=True)
    model_ci_high = models.DecimalField(max_digits=12, decimal_places=6, null=True)
    stable = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"report {self.id} ({self.kind})"


class SigningKeyStatus(models.TextChoices):
    ACTIVE = "active"
    RETIRED = "retired"  # rotated out: still verifies the reports it signed
    REVOKED = "revoked"  # compromised: verifies nothing


class SigningKey(models.Model):
    """The published public half of every key that ever signed; private keys live in files only."""

    key_id = models.CharField(max_length=64, unique=True)
    public_key = models.CharField(max_length=64)  # base64 of the raw 32-byte Ed25519 key
    status = models.CharField(max_length=16, choices=SigningKeyStatus.choices, default=SigningKeyStatus.ACTIVE)
    created_at = models.DateTimeField(auto_now_add=True)
    retired_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
