"""Signed speedup reports: the canonical JSON body exactly as signed, its signature and key,
and what third parties do with a report (dispute it, ask for a re-audit).

A report is immutable once written (PostgreSQL refuses UPDATE and DELETE, migration 0003); a
re-audit makes a new report that supersedes the old one.
"""

from __future__ import annotations

import uuid

from django.db import models
from django.db.models import Q

from accounts.models import Organization
from runs.figures import FIGURE_COLUMN
from runs.models import Run


def _iff(left: Q, right: Q) -> Q:
    """A check that holds when both conditions hold or neither does."""
    return (left & right) | (~left & ~right)


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
    model_speedup = models.DecimalField(**FIGURE_COLUMN, null=True)
    model_ci_low = models.DecimalField(**FIGURE_COLUMN, null=True)
    model_ci_high = models.DecimalField(**FIGURE_COLUMN, null=True)
    stable = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            # One report per run: creating it twice (a task delivered twice) finds the first.
            models.UniqueConstraint(fields=["run"], name="report_one_per_run"),
            # A report is superseded at most once, so the re-audit history is a chain, not a tree.
            models.UniqueConstraint(fields=["supersedes"], name="report_superseded_once"),
            models.CheckConstraint(condition=Q(kind__in=ReportKind.values), name="report_kind_known"),
            models.CheckConstraint(condition=_iff(Q(kind=ReportKind.REAUDIT), Q(supersedes__isnull=False)),
                                   name="report_reaudit_supersedes"),
        ]

    def __str__(self) -> str:
        return f"report {self.id} ({self.kind})"

    @property
    def body_bytes(self) -> bytes:
        # PostgreSQL hands BinaryField back as a memoryview; callers need the bytes as signed.
        return bytes(self.body)


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

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [
            # Exactly one key signs new reports; two active keys would make "current" ambiguous.
            models.UniqueConstraint(fields=["status"], condition=Q(status=SigningKeyStatus.ACTIVE),
                                    name="signingkey_one_active"),
            models.CheckConstraint(condition=Q(status__in=SigningKeyStatus.values), name="signingkey_status_known"),
            models.CheckConstraint(condition=_iff(Q(status=SigningKeyStatus.REVOKED), Q(revoked_at__isnull=False)),
                                   name="signingkey_revoked_has_time"),
        ]

    def __str__(self) -> str:
        return f"{self.key_id} ({self.status})"


class ReauditStatus(models.TextChoices):
    REQUESTED = "requested"  # waiting for the run pipeline
    RUNNING = "running"  # the pipeline claimed it and started a run
    COMPLETED = "completed"  # the re-audit report exists
    FAILED = "failed"  # the re-audit run failed; `error` says why


OPEN_REAUDIT = (ReauditStatus.REQUESTED, ReauditStatus.RUNNING)


class ReauditRequest(models.Model):
    """Someone asked for a report to be measured again; the run pipeline picks these up."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey(Organization, on_delete=models.PROTECT, related_name="reaudit_requests")
    report = models.ForeignKey(Report, on_delete=models.PROTECT, related_name="reaudit_requests")
    requested_by = models.CharField(max_length=254)  # Actor.audit_label
    # Asked by Dyno's operator (staff): outside the per-window limit that binds auditors and disputes.
    by_operator = models.BooleanField(default=False)
    reason = models.TextField()
    status = models.CharField(max_length=16, choices=ReauditStatus.choices, default=ReauditStatus.REQUESTED)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    run = models.OneToOneField(Run, null=True, blank=True, on_delete=models.PROTECT, related_name="reaudit_request")
    result_report = models.OneToOneField(Report, null=True, blank=True, on_delete=models.PROTECT,
                                         related_name="reaudit_of")
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            # One open re-audit per report: a second request (or a dispute) joins the open one.
            models.UniqueConstraint(fields=["report"], condition=Q(status__in=OPEN_REAUDIT),
                                    name="reaudit_one_open_per_report"),
            models.CheckConstraint(condition=Q(status__in=ReauditStatus.values), name="reaudit_status_known"),
            models.CheckConstraint(condition=~Q(status=ReauditStatus.COMPLETED) | Q(result_report__isnull=False),
                                   name="reaudit_completed_has_report"),
            models.CheckConstraint(condition=~Q(reason=""), name="reaudit_has_reason"),
        ]


class DisputeStatus(models.TextChoices):
    OPEN = "open"
    RESOLVED = "resolved"  # the re-audit it asked for produced a new report


class Dispute(models.Model):
    """A customer contests a report inside the dispute window; it always asks for a re-audit."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey(Organization, on_delete=models.PROTECT, related_name="report_disputes")
    report = models.ForeignKey(Report, on_delete=models.PROTECT, related_name="disputes")
    raised_by = models.CharField(max_length=254)  # Actor.audit_label
    reason = models.TextField()
    status = models.CharField(max_length=16, choices=DisputeStatus.choices, default=DisputeStatus.OPEN)
    reaudit = models.ForeignKey(ReauditRequest, on_delete=models.PROTECT, related_name="disputes")
    created_at = models.DateTimeField(auto_now_add=True)
    resolved_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(condition=Q(status__in=DisputeStatus.values), name="dispute_status_known"),
            models.CheckConstraint(condition=~Q(reason=""), name="dispute_has_reason"),
            models.CheckConstraint(condition=_iff(Q(status=DisputeStatus.RESOLVED), Q(resolved_at__isnull=False)),
                                   name="dispute_resolved_has_time"),
        ]
