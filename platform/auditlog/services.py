"""Appending to and verifying the audit log's chain (digests: auditlog/chain.py; key: keys.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.utils import timezone

from auditlog.chain import GENESIS, KEYED, SCHEMES, UNKEYED, event_digest
from auditlog.keys import AuditKeyError, audit_key, audit_key_path
from auditlog.models import AuditChainHead, AuditEvent

__all__ = ["GENESIS", "AuditKeyError", "ChainCheck", "actor_label", "audit_record", "audit_verify_chain"]


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


def _append_key() -> bytes:
    # Development makes the key on first use, but never a second one for a chain the first one keyed:
    # events it wrote would all stop verifying.
    path = audit_key_path()
    if not path.exists() and AuditEvent.objects.filter(scheme=KEYED).exists():
        raise AuditKeyError(f"the audit log key that keyed this database's events is missing from {path}: restore "
                            "it (a new key would verify none of them). A development database can be started "
                            "afresh instead.")
    return audit_key(create=True)


def audit_record(*, action: str, actor: Any = None, organization_id: int | None = None,
                 target: str = "", data: dict[str, Any] | None = None) -> AuditEvent:
    """Append one keyed event. Runs inside the caller's transaction when there is one."""
    payload = json.loads(json.dumps(data or {}, default=str))
    with transaction.atomic():
        head, _ = AuditChainHead.objects.select_for_update().get_or_create(pk=1)
        key = _append_key()
        seq = head.seq + 1
        at = timezone.now()
        actor_text = actor_label(actor)
        digest = event_digest(scheme=KEYED, key=key, seq=seq, at=at.isoformat(), action=action, actor=actor_text,
                              organization_id=organization_id, target=target, data=payload,
                              prev_hash=head.last_hash)
        event = AuditEvent.objects.create(
            seq=seq, at=at, action=action, actor=actor_text, organization_id=organization_id,
            target=target, data=payload, prev_hash=head.last_hash, hash=digest, scheme=KEYED,
        )
        AuditChainHead.objects.filter(pk=1).update(seq=seq, last_hash=digest)
    return event


@dataclass(frozen=True)
class ChainCheck:
    ok: bool
    events: int
    problem: str = ""
    unkeyed: int = 0  # events from before the log was keyed, pinned by the first keyed one


def audit_verify_chain() -> ChainCheck:
    """Recompute every digest in order. Unkeyed (SHA-256) events may only come first, and a chain
    that holds any event must end keyed: an attacker without the key could otherwise rewrite it
    whole as unkeyed events."""
    prev = GENESIS
    expected_seq = 1
    count = unkeyed = 0
    key: bytes | None = None
    for event in AuditEvent.objects.order_by("seq").iterator(chunk_size=2000):
        if event.seq != expected_seq:
            return ChainCheck(False, count, f"event seq {expected_seq} is missing (found {event.seq})", unkeyed)
        if event.prev_hash != prev:
            return ChainCheck(False, count, f"event {event.seq} does not link to event {event.seq - 1}", unkeyed)
        if event.scheme not in SCHEMES:
            return ChainCheck(False, count, f"event {event.seq} has unknown scheme {event.scheme}", unkeyed)
        if event.scheme == UNKEYED and unkeyed != count:
            return ChainCheck(False, count, f"event {event.seq} ({event.action}) is unkeyed after keyed events: "
                                            "it was rewritten", unkeyed)
        if event.scheme == KEYED and key is None:
            try:
                key = audit_key(create=False)
            except AuditKeyError as exc:
                return ChainCheck(False, count, f"cannot check keyed events: {exc}", unkeyed)
        digest = event_digest(scheme=event.scheme, key=key, seq=event.seq, at=event.at.isoformat(),
                              action=event.action, actor=event.actor, organization_id=event.organization_id,
                              target=event.target, data=event.data, prev_hash=event.prev_hash)
        if digest != event.hash:
            hint = "" if event.scheme == UNKEYED else f" (or {audit_key_path()} is not the key it was written with)"
            return ChainCheck(False, count, f"event {event.seq} ({event.action}) was altered{hint}", unkeyed)
        prev = event.hash
        expected_seq += 1
        count += 1
        if event.scheme == UNKEYED:
            unkeyed += 1
    if count and unkeyed == count:
        return ChainCheck(False, count, f"the chain's {count} events are all unkeyed: a keyed log was rewritten "
                                        "(or migration auditlog 0004 has not run)", unkeyed)
    head = AuditChainHead.objects.filter(pk=1).first()
    if head and (head.seq != count or head.last_hash != prev):
        return ChainCheck(False, count, f"the chain ends at event {count} but the head says {head.seq}", unkeyed)
    return ChainCheck(True, count, unkeyed=unkeyed)
