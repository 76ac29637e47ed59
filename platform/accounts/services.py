"""Writes for accounts: organizations, members, API keys, sign-in lock-out."""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from accounts.models import ApiKey, Membership, Organization, Role, Scope, SigninFailure
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


def signin_locked(*, username: str, address: str | None) -> bool:
    since = timezone.now() - timedelta(seconds=settings.DYNO_SIGNIN_LOCKOUT_SECONDS)
    recent = SigninFailure.objects.filter(at__gte=since)
    limit = settings.DYNO_SIGNIN_MAX_FAILURES
    if recent.filter(username=username.strip().lower()).count() >= limit:
        return True
    return bool(address) and recent.filter(address=address).count() >= limit * 4


def signin_failed(*, username: str, address: str | None) -> None:
    SigninFailure.objects.create(username=username.strip().lower()[:254], address=address, at=timezone.now())
    audit_record(action="signin.failed", actor="anonymous", target=f"username:{username.strip().lower()[:100]}",
                 data={"address": address})


def signin_succeeded(*, user, address: str | None) -> None:
    SigninFailure.objects.filter(username=user.get_username()).delete()
    audit_record(action="signin.succeeded", actor=user, data={"address": address})
