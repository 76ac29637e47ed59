"""`manage.py runner_key create NAME --hardware cpu` | `revoke NAME` | `list`: the credentials runner
hosts present to the control API (DYNO_RUNNER_TOKEN on the runner; never a database password)."""

import secrets

from django.core.management.base import BaseCommand, CommandError

from fleet.keys import RunnerKeyError, runner_key_create, runner_key_revoke
from fleet.models import RunnerKey


class Command(BaseCommand):
    help = "Create, revoke or list runner keys (a runner host's scoped credential for the control API)."

    def add_arguments(self, parser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        create = sub.add_parser("create", help="create a key; its token is printed once")
        create.add_argument("name", help="the host or pool the key is for")
        create.add_argument("--hardware", required=True, help="comma-separated hardware classes it may take runs of")
        create.add_argument("--token-file", help="write the token to this file (mode 0600) instead of printing it")
        create.add_argument("--replace", action="store_true", help="drop a key of the same name first (make demo)")
        revoke = sub.add_parser("revoke", help="revoke a key at once")
        revoke.add_argument("name")
        sub.add_parser("list", help="list keys (never their tokens)")

    def handle(self, *args, action: str, **options) -> None:
        if action == "create":
            if options.get("replace"):  # make demo: a fresh key under the same name each start
                runner_key_revoke(name=options["name"])
                RunnerKey.objects.filter(name=options["name"], runners__isnull=True).delete()
                RunnerKey.objects.filter(name=options["name"]).update(name=f"{options['name']}-revoked-{secrets.token_hex(4)}")
            try:
                key, token = runner_key_create(name=options["name"],
                                               hardware=[h.strip() for h in options["hardware"].split(",") if h.strip()])
            except RunnerKeyError as exc:
                raise CommandError(str(exc)) from None
            if options.get("token_file"):
                import os

                fd = os.open(options["token_file"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "w") as handle:
                    handle.write(token + "\n")
                self.stdout.write(f"runner key {key.name} for {', '.join(key.hardware)}: token in {options['token_file']}")
            else:
                self.stdout.write(f"runner key {key.name} for {', '.join(key.hardware)}; set on the runner "
                                  f"(shown once):\nDYNO_RUNNER_TOKEN={token}")
        elif action == "revoke":
            if not runner_key_revoke(name=options["name"]):
                raise CommandError(f"no live runner key named {options['name']!r}.")
            self.stdout.write(f"runner key {options['name']} revoked; its runner's next call is refused.")
        else:
            for key in RunnerKey.objects.all():
                state = f"revoked {key.revoked_at:%Y-%m-%d}" if key.revoked_at else "live"
                used = f"last used {key.last_used_at:%Y-%m-%d %H:%M}" if key.last_used_at else "never used"
                self.stdout.write(f"{key.name}\t{','.join(key.hardware)}\t{state}\t{used}")
