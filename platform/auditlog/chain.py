"""The audit chain's arithmetic: the digest that links an event to the one before it, per scheme.
Pure (no models, no files): the services, verify_auditlog and migration 0004 share it.

Scheme 1 (`UNKEYED`) is SHA-256 of the event's canonical JSON: what the log wrote before it was
keyed. Anyone who can write the table can recompute it, so it only proves what a keyed event
after it covers. Scheme 2 (`KEYED`) is HMAC-SHA256 under a key kept outside the database
(auditlog/keys.py): rewriting any event, or the unkeyed events before the first keyed one, needs
that key.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

UNKEYED = 1
KEYED = 2
SCHEMES = (UNKEYED, KEYED)
GENESIS = "0" * 64


def event_digest(*, scheme: int, key: bytes | None, seq: int, at: str, action: str, actor: str,
                 organization_id: int | None, target: str, data: dict[str, Any], prev_hash: str) -> str:
    """The hex digest stored as the event's `hash` (and the next event's `prev_hash`)."""
    fields: dict[str, Any] = {"seq": seq, "at": at, "action": action, "actor": actor, "org": organization_id,
                              "target": target, "data": data, "prev": prev_hash}
    if scheme == UNKEYED:
        return hashlib.sha256(_canonical(fields)).hexdigest()
    if scheme != KEYED:
        raise ValueError(f"unknown audit chain scheme {scheme!r}")
    if not key:
        raise ValueError("a keyed audit event needs the audit key")
    # The scheme is inside the MAC: an unkeyed digest can never pass for a keyed one.
    return hmac.new(key, _canonical({**fields, "v": KEYED}), hashlib.sha256).hexdigest()


def _canonical(fields: dict[str, Any]) -> bytes:
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str).encode()
