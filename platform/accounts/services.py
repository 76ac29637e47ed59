"""Writes for accounts: organizations, members, API keys, sign-in lock-out (per account, per
address, per proven device)."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from accounts.models import ApiKey, Membership, Organization, Role, Scope, SigninFailure
from accounts.throttle import SigninLocked, wait_phrase
from auditlog.services import audit_record

KEY_PREFIX = "dyno"


class AccountError(ValueError):
    """A request about accounts that cannot be honoured; the message says why."""


def organization_create(*, slug: str, name: str, owner_email: str | None = None,
                        owner_password: str | None = None) -> Organization:
    if Organization.objects.filter(slug=slug).exists():
        raise AccountError(f"organization {slug!r} already exists: pick another slug.")
    with transaction.atomic():
        org = Organization.objects.create(slug=slug, name=name)
        audit_record(action="org.created", organization_id=org.pk, target=f"org:{slug}")
        if owner_email:
            member_add(organization=org, email=owner_email, role=Role.OWNER, password=owner_password)
    return org


def member_add(*, organization: Organization, email: str, role: str, password: str | None = None,
               operator: bool = False):
    """`email` joins `organization` in `role`. Auditors are appointed by the operator (staff, a
    management command), never by the audited organization, like auditor keys."""
    if role not in Role.values:
        raise AccountError(f"role {role!r} is unknown: use one of {', '.join(Role.values)}.")
    if role == Role.AUDITOR and not operator:
        raise AccountError("auditors are appointed by Dyno's operators, not by the audited organization: "
                           "ask them to add the auditor.")
    User = get_user_model()
    email = email.strip().lower()
    user, created = User.objects.get_or_create(username=email, defaults={"email": email})
    if created:
        if password:
            user.set_password(password)
        else:
            user.set_unusable_password()
        user.save()
    Membership.objects.update_or_create(user=user, organization=organization, defaults={"role": role})
    audit_record(action="member.added", organization_id=organization.pk,
                 target=f"user:{user.pk}", data={"role": role})
    return user


def _digest(raw: str) -> str:
    # API keys carry 256 bits of randomness, so a fast hash is as safe as a slow one here.
    return hashlib.sha256(raw.encode()).hexdigest()


def api_key_create(*, organization: Organization, scope: str, name: str, created_by=None,
                   operator: bool = False) -> tuple[ApiKey, str]:
    """Create a key and return it with its plaintext, which is never stored and never shown again.

    Auditor keys request re-audits of the organization's signed reports: the audited party must not
    appoint its own auditor, so only the operator (staff, or the `create_api_key` command) grants them."""
    if scope not in Scope.values:
        raise AccountError(f"scope {scope!r} is unknown: use one of {', '.join(Scope.values)}.")
    if scope == Scope.AUDITOR and not operator:
        raise AccountError("auditor keys are granted by Dyno's operators, not by the audited organization: "
                           "ask them to appoint an independent auditor for your reports.")
    if not name.strip():
        raise AccountError("an API key needs a name that says where it is used.")
    prefix = secrets.token_hex(6)
    raw = f"{KEY_PREFIX}_{prefix}_{secrets.token_urlsafe(32)}"
    with transaction.atomic():
        key = ApiKey.objects.create(organization=organization, scope=scope, name=name.strip(),
                                    prefix=prefix, digest=_digest(raw), created_by=created_by)
        audit_record(action="apikey.created", actor=created_by, organization_id=organization.pk,
                     target=f"key:{prefix}", data={"scope": scope, "name": key.name})
    return key, raw


def api_key_revoke(*, key: ApiKey, actor=None) -> None:
    with transaction.atomic():
        changed = ApiKey.objects.filter(pk=key.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())
        if changed:
            audit_record(action="apikey.revoked", actor=actor, organization_id=key.organization_id,
                         target=f"key:{key.prefix}")


def api_key_authenticate(raw: str) -> ApiKey | None:
    """The active key for a bearer token, or None. Constant-time on the digest comparison."""
    parts = raw.split("_")
    if len(parts) < 3 or parts[0] != KEY_PREFIX:
        return None
    key = ApiKey.objects.select_related("organization").filter(prefix=parts[1]).first()
    if key is None or not secrets.compare_digest(key.digest, _digest(raw)) or key.revoked_at:
        return None
    now = timezone.now()
    # Touch last-used at most once a minute so a busy key does not write on every request.
    if key.last_used_at is None or now - key.last_used_at > timedelta(minutes=1):
        ApiKey.objects.filter(pk=key.pk).update(last_used_at=now)
        key.last_used_at = now
    return key


@dataclass(frozen=True)
class SigninAttempt:
    """One sign-in attempt: the username as typed (trimmed, lower case), the client's address, and
    the id of this browser's device proof for that username ("" when it has none)."""

    username: str
    address: str | None
    device: str = ""


def _lockout_window_start(now: datetime) -> datetime:
    return now - timedelta(seconds=settings.DYNO_SIGNIN_LOCKOUT_SECONDS)


def _lock_lifts_in(failures, *, limit: int, now: datetime) -> float | None:
    """Seconds until fewer than `limit` of `failures` lie inside the window; None if fewer already."""
    times = list(failures.order_by("-at").values_list("at", flat=True)[:limit])
    if len(times) < limit:
        return None
    return (times[-1] + timedelta(seconds=settings.DYNO_SIGNIN_LOCKOUT_SECONDS) - now).total_seconds()


def signin_refusal(*, attempt: SigninAttempt) -> SigninLocked | None:
    """Why this attempt is refused before its password is checked, or None.

    DYNO_SIGNIN_MAX_FAILURES failures on one username inside the window, from clients that never
    proved it, lock that account for all of them, whatever their address: password guessing stops
    there. A browser that signed in to the account before (`attempt.device`) is not locked out by
    those failures; its own failures lock it alone."""
    now = timezone.now()
    failures = SigninFailure.objects.filter(at__gte=_lockout_window_start(now), username=attempt.username,
                                            device=attempt.device)
    wait = _lock_lifts_in(failures, limit=settings.DYNO_SIGNIN_MAX_FAILURES, now=now)
    if wait is None:
        return None
    return SigninLocked(f"Too many failed sign-ins for this account. Try again {wait_phrase(wait, now=now)}, "
                        "or ask an owner to reset your password.", retry_after=wait)


def signin_failed(*, attempt: SigninAttempt) -> SigninLocked | None:
    """Record a wrong password. Returns the refusal to answer with instead of "do not match" when
    the client's address is locked.

    An address is locked after DYNO_SIGNIN_ADDRESS_MAX_FAILURES failures from clients without a
    device proof, on any usernames, inside the window. Only failing attempts are refused there: the
    password is still checked, so a real user behind the same address (the proxy, an office) signs
    in with the right one while a flood of made-up names goes on, and the flood learns nothing but
    429s. Each failure also counts towards its username's lock."""
    now = timezone.now()
    SigninFailure.objects.create(username=attempt.username, address=attempt.address, device=attempt.device, at=now)
    SigninFailure.objects.filter(at__lt=_lockout_window_start(now)).delete()  # nothing older is ever counted
    audit_record(action="signin.failed", actor="anonymous", target=f"username:{attempt.username[:100]}",
                 data={"address": attempt.address, "proven_device": bool(attempt.device)})
    if not attempt.address or attempt.device:
        return None
    limit = settings.DYNO_SIGNIN_ADDRESS_MAX_FAILURES
    failures = SigninFailure.objects.filter(at__gte=_lockout_window_start(now), address=attempt.address, device="")
    if failures.count() <= limit:  # this failure and `limit` before it lock the address
        return None
    wait = _lock_lifts_in(failures, limit=limit, now=now) or 1.0
    return SigninLocked(f"Too many failed sign-ins from your network. Try again {wait_phrase(wait, now=now)}.",
                        retry_after=wait)


def signin_succeeded(*, user, attempt: SigninAttempt) -> None:
    """The client proved the account: its own failures on it are forgotten (another client's still
    count, so a guesser gains nothing when the real user signs in)."""
    own = Q(address=attempt.address, device="")
    if attempt.device:
        own |= Q(device=attempt.device)
    SigninFailure.objects.filter(own, username=user.get_username().strip().lower()).delete()
    audit_record(action="signin.succeeded", actor=user, data={"address": attempt.address})
