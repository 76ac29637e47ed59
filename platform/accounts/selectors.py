"""Who is acting and which organizations they may see: the one gate for org-owned data.

Every view and API endpoint builds an `Actor` and passes it to the selectors of its app, which
filter by `actor.org_ids`; anything outside them is a 404, never another org's data.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.http import Http404

from accounts.models import ApiKey, Membership, Organization, Role, Scope


@dataclass(frozen=True)
class Actor:
    user: object | None = None
    api_key: ApiKey | None = None
    roles: dict[int, str] = field(default_factory=dict)  # organization id -> role
    is_staff: bool = False

    @property
    def org_ids(self) -> frozenset[int]:
        return frozenset(self.roles)

    @property
    def audit_label(self) -> str:
        if self.api_key is not None:
            return f"key:{self.api_key.prefix}"
        if self.user is not None:
            return f"user:{self.user.pk}:{self.user.get_username()}"
        return "anonymous"

    def role_in(self, organization_id: int) -> str | None:
        return self.roles.get(organization_id)

    def can_write(self, organization_id: int) -> bool:
        """Customers (owners, members, customer-scoped keys) write models and runs."""
        return self.roles.get(organization_id) in (Role.OWNER, Role.MEMBER, Scope.CUSTOMER)

    @property
    def default_org_id(self) -> int | None:
        writable = sorted(org for org, role in self.roles.items() if self.can_write(org))
        return writable[0] if writable else (min(self.roles) if self.roles else None)


def actor_for_user(user) -> Actor:
    if user is None or not user.is_authenticated:
        return Actor()
    roles = dict(Membership.objects.filter(user=user).values_list("organization_id", "role"))
    return Actor(user=user, roles=roles, is_staff=bool(user.is_staff))


def actor_for_key(key: ApiKey) -> Actor:
    return Actor(api_key=key, roles={key.organization_id: key.scope})


def organization_for_actor(actor: Actor, organization_id: int | None = None) -> Organization:
    org_id = organization_id if organization_id is not None else actor.default_org_id
    if org_id is None or org_id not in actor.org_ids:
        raise Http404("No such organization.")
    return Organization.objects.get(pk=org_id)


def api_keys_for_actor(actor: Actor):
    return ApiKey.objects.filter(organization_id__in=actor.org_ids).order_by("-created_at")
