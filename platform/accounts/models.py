"""Organizations, who belongs to them in which role, their API keys, sign-in failures, and the
fixed-window counters behind throttles and quotas.

Every org-owned object hangs off an Organization; selectors filter by it (see selectors.py).
"""

from __future__ import annotations

from django.conf import settings
from django.db import models


class Organization(models.Model):
    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.slug


class Role(models.TextChoices):
    OWNER = "owner"
    MEMBER = "member"
    FINANCE = "finance"
    AUDITOR = "auditor"


class Membership(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "organization"], name="membership_unique")]


class Scope(models.TextChoices):
    CUSTOMER = "customer"
    FINANCE = "finance"
    AUDITOR = "auditor"


class ApiKey(models.Model):
    """A bearer key `dyno_<prefix>_<secret>`; only the sha256 of the whole key is stored."""

    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=100)
    scope = models.CharField(max_length=16, choices=Scope.choices)
    prefix = models.CharField(max_length=16, unique=True)
    digest = models.CharField(max_length=64)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.organization.slug}:{self.name} ({self.scope})"

    @property
    def active(self) -> bool:
        return self.revoked_at is None


class SigninFailure(models.Model):
    """One failed sign-in; counted per username and per address inside the lock-out window.

    `device` is set when the browser proved this username at an earlier sign-in (a signed cookie):
    its failures lock that device only, never the account for everyone else."""

    username = models.CharField(max_length=254, db_index=True)
    address = models.GenericIPAddressField(null=True, blank=True, db_index=True)
    device = models.CharField(max_length=32, blank=True, default="")
    at = models.DateTimeField(db_index=True)


class WindowCounter(models.Model):
    """A fixed-window count under one key: an address's posts to a public form in a minute, an
    organization's upload bytes in a UTC day. Written only by accounts.throttle.window_take."""

    key = models.CharField(max_length=200)
    window_start = models.DateTimeField()
    expires_at = models.DateTimeField(db_index=True)
    count = models.BigIntegerField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["key", "window_start"], name="windowcounter_key_window")]
