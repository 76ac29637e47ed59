"""`manage.py appoint_auditor ORG EMAIL`: the operator appoints an auditor of an organization."""

from django.core.management.base import BaseCommand, CommandError

from accounts.models import Membership, Organization, Role
from accounts.services import AccountError, member_add


class Command(BaseCommand):
    help = ("Appoint EMAIL as an auditor of ORG (the operator's act; an organization cannot appoint its own). "
            "The person must not already belong to ORG in another role.")

    def add_arguments(self, parser) -> None:
        parser.add_argument("org", help="organization slug")
        parser.add_argument("email")

    def handle(self, *args, org: str, email: str, **options) -> None:
        organization = Organization.objects.filter(slug=org).first()
        if organization is None:
            raise CommandError(f"no organization {org!r}: list them in the admin or create it with createorg.")
        current = (Membership.objects.filter(organization=organization, user__username=email.strip().lower())
                   .values_list("role", flat=True).first())
        if current not in (None, Role.AUDITOR):
            raise CommandError(f"{email} is a {current} of {org}: the audited organization's own people cannot "
                               "audit it; appoint someone independent.")
        try:
            member_add(organization=organization, email=email, role=Role.AUDITOR, operator=True)
        except AccountError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"{email} audits {org}; set a password with `changepassword {email.strip().lower()}`")
