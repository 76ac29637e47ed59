"""The append-only, hash-chained audit log of security- and money-relevant events.

Each event's digest covers its content and the previous event's digest, so any edit or deletion
breaks the chain; since migration 0004 the digest is an HMAC under a key kept outside the database
(auditlog/chain.py, keys.py), so rewriting the chain needs that key too. `manage.py
verify_auditlog` checks it. PostgreSQL refuses UPDATE and DELETE.
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
    # auditlog.chain: 1 = SHA-256 (events written before the log was keyed), 2 = HMAC-SHA256.
    scheme = models.PositiveSmallIntegerField(default=1)

    class Meta:
        ordering = ["seq"]


class AuditChainHead(models.Model):
    """A single row locked while appending, so two writers never fork the chain."""

    seq = models.BigIntegerField(default=0)
    last_hash = models.CharField(max_length=64, default="0" * 64)
