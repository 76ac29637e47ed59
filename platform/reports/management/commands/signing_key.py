"""`manage.py signing_key list|rotate|adopt|revoke`: the report signing keys, for operators."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError, CommandParser

from reports.models import SigningKey
from reports.signing import (
    SigningKeyError,
    signing_key_adopt,
    signing_key_path,
    signing_key_revoke,
    signing_key_rotate,
)

ACTOR = "operator:manage.py signing_key"


class Command(BaseCommand):
    help = "List, rotate, adopt or revoke the Ed25519 keys that sign reports (private keys are never shown)."

    def add_arguments(self, parser: CommandParser) -> None:
        commands = parser.add_subparsers(dest="action", required=True)
        commands.add_parser("list", help="every published key with its status")
        commands.add_parser("rotate", help="create a new active key; the old one is retired and still verifies")
        commands.add_parser("adopt", help="make the key now in DYNO_SIGNING_KEY_PATH the active one")
        revoke = commands.add_parser("revoke", help="revoke a key: nothing it signed verifies any more")
        revoke.add_argument("key_id")
        revoke.add_argument("--reason", required=True, help="why (recorded in the audit log)")

    def handle(self, *args, action: str, **options) -> None:
        try:
            if action == "list":
                self._list()
            elif action == "rotate":
                row = signing_key_rotate(actor=ACTOR)
                self.stdout.write(f"rotated: {row.key_id} is active (key file {signing_key_path()}); the "
                                  "previous key is retired and still verifies the reports it signed.")
            elif action == "adopt":
                row = signing_key_adopt(actor=ACTOR)
                self.stdout.write(f"adopted: {row.key_id} is active.")
            elif action == "revoke":
                row = signing_key_revoke(key_id=options["key_id"], reason=options["reason"], actor=ACTOR)
                self.stdout.write(f"revoked: {row.key_id}; reports it signed no longer verify.")
                if not SigningKey.objects.filter(status="active").exists():
                    self.stdout.write("No key is active now: run `manage.py signing_key rotate` before the "
                                      "next report is signed.")
        except SigningKeyError as exc:
            raise CommandError(str(exc)) from None

    def _list(self) -> None:
        rows = SigningKey.objects.order_by("created_at", "id")
        if not rows:
            self.stdout.write(f"no signing keys yet; the first report creates one at {signing_key_path()}.")
        for row in rows:
            when = row.revoked_at or row.retired_at
            self.stdout.write(f"{row.key_id}  {row.status:8}  created {row.created_at:%Y-%m-%d %H:%M}"
                              + (f"  {row.status} {when:%Y-%m-%d %H:%M}" if when else ""))
