"""Runner keys: create, look up, revoke. A token is shown once, when created; the database keeps its
SHA-256 only, so a database dump holds nothing a runner could present."""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from auditlog.services import audit_record
from fleet.models import RunnerKey

PREFIX = "dyno_runner_"
LAST_USED_RESOLUTION = timedelta(minutes=1)


class RunnerKeyError(ValueError):
    pass


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def runner_key_create(*, name: str, hardware: list[str]) -> tuple[RunnerKey, str]:
    """A new key for `hardware` (classes this deployment serves); returns it and its token."""
    name = name.strip()
    if not name:
        raise RunnerKeyError("a runner key needs a name (the host or pool it is for).")
    unknown = [h for h in hardware if h not in settings.DYNO_HARDWARE_CLASSES]
    if not hardware or unknown:
        raise RunnerKeyError(f"hardware classes {unknown or hardware!r} are not served here; choose from "
                             f"{', '.join(settings.DYNO_HARDWARE_CLASSES)} (DYNO_HARDWARE_CLASSES).")
    if RunnerKey.objects.filter(name=name).exists():
        raise RunnerKeyError(f"a runner key named {name!r} exists; revoke it first or choose another name.")
    token = PREFIX + secrets.token_urlsafe(32)
    with transaction.atomic():
        key = RunnerKey.objects.create(name=name, token_sha256=_digest(token), hardware=sorted(set(hardware)))
        audit_record(action="runner_key.created", target=f"runner_key:{name}", data={"hardware": key.hardware})
    return key, token


def runner_key_for(token: str) -> RunnerKey | None:
    """The live key `token` belongs to, or None (unknown, malformed or revoked)."""
    if not token.startswith(PREFIX) or len(token) > 200:
        return None
    key = RunnerKey.objects.filter(token_sha256=_digest(token), revoked_at__isnull=True).first()
    now = timezone.now()
    if key is not None and (key.last_used_at is None or now - key.last_used_at >= LAST_USED_RESOLUTION):
        # A busy runner asks every few seconds: the time of last use is kept to the minute, not
        # written on every request.
        RunnerKey.objects.filter(pk=key.pk).update(last_used_at=now)
    return key


def runner_key_revoke(*, name: str) -> bool:
    """Revoke at once: the key's next request is refused, and its workers may register under another."""
    with transaction.atomic():
        done = bool(RunnerKey.objects.filter(name=name, revoked_at__isnull=True).update(revoked_at=timezone.now()))
        if done:
            audit_record(action="runner_key.revoked", target=f"runner_key:{name}")
    return done
