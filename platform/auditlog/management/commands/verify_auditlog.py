"""`manage.py verify_auditlog`: recompute the audit log's chain with its key; exit 1 if it is broken."""

from django.core.management.base import BaseCommand, CommandError

from auditlog.keys import AuditKeyError, audit_key, audit_key_id
from auditlog.services import audit_verify_chain


class Command(BaseCommand):
    help = "Verify the append-only audit log's chain (HMAC-SHA256 under the audit key, SHA-256 before keying)."

    def handle(self, *args, **options) -> None:
        check = audit_verify_chain()
        if not check.ok:
            raise CommandError(f"audit log chain BROKEN after {check.events} good events: {check.problem}")
        try:
            key = f"key {audit_key_id(audit_key(create=False))}"
        except AuditKeyError:
            key = "no key needed yet"
        self.stdout.write(f"audit log chain intact: {check.events} events "
                          f"({check.events - check.unkeyed} keyed, {check.unkeyed} from before keying; {key})")
