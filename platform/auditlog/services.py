"""Appending to and verifying the audit log's hash chain."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.utils import timezone

from auditlog.models import AuditChainHead, AuditEvent

GENESIS = "0" * 64


def _event_hash(*, seq: int, at: str, action: str, actor: str, organization_id: int | None,
                target: str, data: dict[str, Any], prev_hash: str) -> str:
    body = json.dumps(
        {"seq": seq, "at": at, "action": action, "actor": actor, "org": organization_id,
         "target": target, "data": data, "prev": prev_hash},
        sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str,
    )
    return hashlib.sha256(body.encode()).hexdigest()


def actor_label(actor: Any) -> str:
    """A stable text for who did it: a user, an API key, or the system."""
    if actor is None:
        return "system"
    if isinstance(actor, str):
        return actor
    label = getattr(actor, "audit_label", None)
    if label:
        return label
    if getattr(actor, "pk", None) is not None and hasattr(actor, "get_username"):
        return f"user:{actor.pk}:{actor.get_username()}"
    return str(actor)


def audit_record(*, action: str, actor: Any = None, organization_id: int | None = None,
                 target: str = "", data: dict[str, Any] | None = None) -> AuditEvent:
    """Append one event. Runs inside the caller's transaction when there is one."""
    payload = json.loads(json.dumps(data or {}, default=str))
    with transaction.atomic():
        head, _ = AuditChainHead.objects.select_for_update().get_or_create(pk=1)
        seq = head.seq + 1
        at = timezone.now()
        actor_text = actor_label(actor)
        digest = _event_hash(seq=seq, at=at.isoformat(), action=action, actor=actor_text,
                             organization_id=organization_id, target=target, data=payload,
                             prev_hash=head.last_hash)
        event = AuditEvent.objects.create(
            seq=seq, at=at, action=action, actor=actor_text, organization_id=organization_id,
            target=target, data=payload, prev_hash=head.last_hash, hash=digest,
        )
        AuditChainHead.objects.filter(pk=1).update(seq=seq, last_hash=digest)
    return event


@dataclass(frozen=True)
class ChainCheck:
    ok: bool
    events: int
    problem: str = ""


def audit_verify_chain() -> ChainCheck:
    prev = GENESIS
    expected_seq = 1
    count = 0
    for event in AuditEvent.objects.order_by("seq").iterator(chunk_size=2000):
        if event.seq != expected_seq:
            return ChainCheck(False, count, f"event seq {expected_seq} is missing (found {event.seq})")
        if event.prev_hash != prev:
            return ChainCheck(False, count, f"event {event.seq} does not link to event {event.seq - 1}")
        digest = _event_hash(seq=event.seq, at=event.at.isoformat(), action=event.action,
                             actor=event.actor, organization_id=event.organization_id,
                             target=event.target, data=event.data, prev_hash=event.prev_hash)
        if digest != event.hash:
            return ChainCheck(False, count, f"event {event.seq} ({event.action}) was altered")
        prev = event.hash
        expected_seq += 1
        count += 1
    head = AuditChainHead.objects.filter(pk=1).first()
    if head and (head.seq != count or head.last_hash != prev):
        return ChainCheck(False, count, f"the chain ends at event {count} but the head says {head.seq}")
    return ChainCheck(True, count)
