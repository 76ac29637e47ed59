"""`manage.py createorg SLUG --name NAME [--owner EMAIL]`: create an organization."""

from django.core.management.base import BaseCommand, CommandError

from accounts.services import AccountError, organization_create


class Command(BaseCommand):
    help = "Create an organization, optionally with an owner (created if new, with no password)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("slug")
        parser.add_argument("--name", required=True)
        parser.add_argument("--owner", help="email of the owner; set a password with `changepassword`")

    def handle(self, *args, slug: str, name: str, owner: str | None, **options) -> None:
        try:
            org = organization_create(slug=slug, name=name, owner_email=owner)
        except AccountError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"created organization {org.slug} (id {org.pk})")
