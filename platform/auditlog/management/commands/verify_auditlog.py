"""`manage.py verify_auditlog [--checkpoint FILE ...]`: recompute the audit log's chain with its key,
and check that it still holds each signed checkpoint given; exit 1 if anything is broken."""

import json
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from auditlog.checkpoint import checkpoint_problem
from auditlog.keys import AuditKeyError, audit_key, audit_key_id
from auditlog.services import audit_verify_chain


class Command(BaseCommand):
    help = "Verify the append-only audit log's chain (HMAC-SHA256 under the audit key, SHA-256 before keying)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--checkpoint", action="append", type=Path, default=[], metavar="FILE",
                            help="a signed checkpoint (manage.py auditlog_checkpoint) the chain must still hold")

    def handle(self, *args, **options) -> None:
        check = audit_verify_chain()
        if not check.ok:
            raise CommandError(f"audit log chain BROKEN after {check.events} good events: {check.problem}")
        if options["checkpoint"]:
            from reports.signing import keys_document

            keys = keys_document()
            for path in options["checkpoint"]:
                try:
                    document = json.loads(path.read_text())
                except (OSError, UnicodeDecodeError, ValueError) as exc:
                    raise CommandError(f"cannot read checkpoint {path}: {exc}") from None
                problem = checkpoint_problem(document, keys)
                if problem:
                    raise CommandError(f"audit log chain BROKEN against {path.name}: {problem}")
        try:
            key = f"key {audit_key_id(audit_key(create=False))}"
        except AuditKeyError:
            key = "no key needed yet"
        held = f"; holds {len(options['checkpoint'])} checkpoint(s)" if options["checkpoint"] else ""
        self.stdout.write(f"audit log chain intact: {check.events} events "
                          f"({check.events - check.unkeyed} keyed, {check.unkeyed} from before keying; {key}){held}")
