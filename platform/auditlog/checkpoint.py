"""Signed checkpoints of the audit log's head, kept outside the database.

The chain's digests are keyed (auditlog/chain.py), so no one without the key can rewrite an event;
but someone who can write the database can still cut its newest events off and set the head row
back: what is left verifies. A checkpoint closes that: the head (its sequence number and digest),
signed with the report signing key, written to a file the operator keeps elsewhere (object storage,
another host, a customer's inbox). `manage.py verify_auditlog --checkpoint FILE` then fails when
the chain no longer reaches that event, or holds a different one there.

The signed bytes are the checkpoint's canonical JSON after a prefix naming it, so a signed
checkpoint can never pass for a signed report, nor a report for a checkpoint.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.utils import timezone

from auditlog.models import AuditChainHead, AuditEvent
from proof.canonical import canonical_bytes
from proof.signature import verify

SCHEMA = "dyno.audit-checkpoint/1"
_DOMAIN = b"dyno.audit-checkpoint/1\n"


def signed_bytes(body: dict[str, Any]) -> bytes:
    return _DOMAIN + canonical_bytes(body)


def checkpoint_make(*, now: datetime | None = None) -> dict[str, Any]:
    """The current head, signed: `{"checkpoint": {schema, seq, hash, at}, "signature": {...}}`."""
    from reports.signing import report_sign

    head = AuditChainHead.objects.filter(pk=1).first()
    seq, digest = (head.seq, head.last_hash) if head else (0, "0" * 64)
    body = {"schema": SCHEMA, "seq": seq, "hash": digest, "at": (now or timezone.now()).isoformat()}
    return {"checkpoint": body, "signature": report_sign(body=signed_bytes(body))}


def checkpoint_problem(document: Any, keys_document: dict[str, Any]) -> str | None:
    """Why the database's chain does not hold `document`'s checkpoint (None: it does). The
    signature must be by a published, non-revoked key; the event at its sequence number must
    exist with its digest. The chain itself is verified separately (audit_verify_chain)."""
    if not isinstance(document, dict) or not isinstance(document.get("checkpoint"), dict):
        return "not a checkpoint file: expected {\"checkpoint\": {...}, \"signature\": {...}}"
    body = document["checkpoint"]
    if body.get("schema") != SCHEMA or not isinstance(body.get("seq"), int) or not isinstance(body.get("hash"), str):
        return f"not a {SCHEMA} checkpoint"
    result = verify(signed_bytes(body), document.get("signature"), keys_document)
    if not result.valid:
        return f"the checkpoint's signature does not verify ({result.reason}: {result.message})"
    seq, digest = body["seq"], body["hash"]
    if seq == 0:
        return None
    event = AuditEvent.objects.filter(seq=seq).only("hash").first()
    if event is None:
        last = AuditEvent.objects.order_by("-seq").values_list("seq", flat=True).first() or 0
        return (f"the checkpoint of {body.get('at')} saw event {seq}, but the chain ends at event {last}: "
                "events were removed after it")
    if event.hash != digest:
        return f"event {seq} is not the one the checkpoint of {body.get('at')} saw: the chain was rewritten"
    return None
