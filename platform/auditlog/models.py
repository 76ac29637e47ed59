"""The append-only, hash-chained audit log of security- and money-relevant events.

Each event's hash covers its content and the previous event's hash, so any edit or deletion
breaks the chain; `manage.py verify_auditlog` checks it. PostgreSQL refuses UPDATE and DELETE.
"""

from django.db import models


class AuditEvent(models.Model):
    seq = models.BigIntegerField(unique=True)
    at = models.DateTimeField()
    action = models.CharField(max_length=64, db_index=True)
    actor = models.CharField(max_length=254, blank=True)  # "user:<id>:<email>" | "key:<prefix>" | "system"
    organization_id = models.BigIntegerField(null=True, blank=True, db_index=True)
    target = models.CharField(max_length=200, blank=True)
    data = models.JSONField(default=dict)
    prev_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64, unique=True)

    class Meta:
        ordering = ["seq"]


class AuditChainHead(models.Model):
    """A single row locked while appending, so two writers never fork the chain."""

    seq = models.BigIntegerField(default=0)
    last_hash = models.CharField(max_length=64, default="0" * 64)
