"""`manage.py auditlog_checkpoint --out DIR`: sign the audit log's head and write it to DIR.

Keep the files away from the database (and its backups): `verify_auditlog --checkpoint FILE` proves
with one of them that no event up to it was removed or rewritten since.
"""

import json
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from auditlog.checkpoint import checkpoint_make


class Command(BaseCommand):
    help = "Write a signed checkpoint of the audit log's head (keep it outside the database)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--out", required=True, type=Path, help="directory to write checkpoint-SEQ.json into")

    def handle(self, *args, **options) -> None:
        out: Path = options["out"]
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CommandError(f"cannot use {out}: {exc.strerror}") from None
        document = checkpoint_make()
        path = out / f"checkpoint-{document['checkpoint']['seq']}.json"
        path.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
        self.stdout.write(f"wrote {path}: event {document['checkpoint']['seq']}, signed by "
                          f"{document['signature']['key_id']}")
