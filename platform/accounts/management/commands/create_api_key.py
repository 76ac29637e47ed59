"""`manage.py create_api_key --org SLUG --scope SCOPE --name NAME`: print a new key once."""

from django.core.management.base import BaseCommand, CommandError

from accounts.models import Organization, Scope
from accounts.services import AccountError, api_key_create


class Command(BaseCommand):
    help = "Create an API key for an organization and print it (it is shown only this once)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--org", required=True)
        parser.add_argument("--scope", required=True, choices=Scope.values)
        parser.add_argument("--name", required=True)

    def handle(self, *args, org: str, scope: str, name: str, **options) -> None:
        organization = Organization.objects.filter(slug=org).first()
        if organization is None:
            raise CommandError(f"no organization {org!r}: create it with `manage.py createorg`.")
        try:
            _, raw = api_key_create(organization=organization, scope=scope, name=name, operator=True)
        except AccountError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(raw)
