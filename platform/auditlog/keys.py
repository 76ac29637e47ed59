"""The audit log's HMAC key: one file outside the database (settings.DYNO_AUDIT_KEY_PATH, mode 0600,
beside the report signing key). Development creates it on first use; production requires it.

Whoever can write the database but cannot read this file cannot rewrite the log without
`verify_auditlog` noticing. Nothing here returns the key to a caller outside auditlog, logs it or
renders it; `audit_key_id` names it (a digest, not the key) so two hosts can tell they share it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import stat
from pathlib import Path

from django.conf import settings

log = logging.getLogger(__name__)

KEY_BYTES = 32
MIN_KEY_CHARS = 32


class AuditKeyError(RuntimeError):
    """The audit key is missing, unreadable or unsafe; the message says what to do."""


def audit_key_path() -> Path:
    configured = getattr(settings, "DYNO_AUDIT_KEY_PATH", None)
    return Path(configured) if configured else Path(settings.VAR_DIR) / "keys" / "audit-hmac.key"


def audit_key(*, create: bool) -> bytes:
    """The key. With `create`, development writes a new one when the file is missing; production never does
    (a key made up on the spot would verify nothing the real one wrote)."""
    path = audit_key_path()
    if not path.exists():
        if not create or getattr(settings, "PRODUCTION", False):
            raise AuditKeyError(
                f"no audit log key at {path}: create one with `python -c 'import secrets; "
                f"print(secrets.token_hex(32))' > {path} && chmod 600 {path}` on every web and control host "
                "(the same file everywhere; keep a copy outside the database's backups), or set "
                "DYNO_AUDIT_KEY_PATH.")
        _create(path)
    return _read(path)


def audit_key_id(key: bytes) -> str:
    """A short public name of the key: the first 16 hex digits of its SHA-256."""
    return hashlib.sha256(b"dyno-audit-key-id:" + key).hexdigest()[:16]


def _create(path: Path) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    staging = path.with_name(f"{path.name}.{os.getpid()}.{secrets.token_hex(4)}.new")
    descriptor = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(descriptor, "w") as handle:
            handle.write(secrets.token_hex(KEY_BYTES) + "\n")
        # link() fails if the file exists: a second process creating it at the same moment keeps the first's.
        os.link(staging, path)
        log.info("created a development audit log key at %s", path)
    except FileExistsError:
        pass
    finally:
        staging.unlink(missing_ok=True)


def _read(path: Path) -> bytes:
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
        text = path.read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise AuditKeyError(f"cannot read the audit log key at {path}: {exc}") from None
    if mode & 0o077:
        raise AuditKeyError(f"{path} is readable by others (mode {mode:o}); run `chmod 600 {path}` first.")
    if len(text) < MIN_KEY_CHARS:
        raise AuditKeyError(f"the audit log key at {path} is {len(text)} characters; use at least {MIN_KEY_CHARS} "
                            "(`python -c 'import secrets; print(secrets.token_hex(32))'`).")
    return text.encode()
