"""`manage.py verify_auditlog`: recompute the audit log's hash chain; exit 1 if it is broken."""

from django.core.management.base import BaseCommand, CommandError

from auditlog.services import audit_verify_chain


class Command(BaseCommand):
    help = "Verify the append-only audit log's hash chain."

    def handle(self, *args, **options) -> None:
        check = audit_verify_chain()
        if not check.ok:
            raise CommandError(f"audit log chain BROKEN after {check.events} good events: {check.problem}")
        self.stdout.write(f"audit log chain intact: {check.events} events")
