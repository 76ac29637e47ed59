"""Report signing keys: the private key file, the published public halves, rotation, revocation.
The only module that reads the private key; nothing here returns, logs or renders it.

The private key lives in one file (settings.DYNO_SIGNING_KEY_PATH, mode 0600), outside media and
static, and is never passed to runner sandboxes. SigningKey rows hold the public halves with
their status: rotation retires the old key (its public half stays published, so what it signed
still verifies) and destroys its private file; revocation makes a key verify nothing, in the
database as well (migration 0003 refuses to change a revoked row).
"""

from __future__ import annotations

import base64
import logging
import os
import stat
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from auditlog.services import audit_record
from reports.models import SigningKey, SigningKeyStatus
from proof.signature import (
    KeyRing,
    KeyStatus,
    PublishedKey,
    generate_private_key,
    key_id,
    load_private_key,
    public_key_b64,
    save_private_key,
    sign,
)

log = logging.getLogger(__name__)

DEFAULT_KEY_RELATIVE = Path("keys") / "report-signing.pem"


class SigningKeyError(RuntimeError):
    """Reports cannot be signed or keys cannot be changed; the message says what to do."""


def signing_key_path() -> Path:
    configured = getattr(settings, "DYNO_SIGNING_KEY_PATH", None)
    return Path(configured) if configured else Path(settings.VAR_DIR) / DEFAULT_KEY_RELATIVE


def report_sign(*, body: bytes) -> dict[str, str]:
    """The detached signature of `body` by the active key (created on first use in development)."""
    private_key = _private_key()
    identifier = key_id(private_key)
    row = SigningKey.objects.filter(key_id=identifier).first()
    if row is None:
        row = _register_first_key(private_key)
    if row.status != SigningKeyStatus.ACTIVE:
        raise SigningKeyError(
            f"the signing key in {signing_key_path()} ({identifier}) is {row.status}; it may not sign. "
            "Run `manage.py signing_key rotate` to create a new active key.")
    return sign(body, private_key)


def signing_key_rotate(*, actor: object = None) -> SigningKey:
    """Create a new active key; the old one is retired (still verifies) and its private file is gone."""
    path = signing_key_path()
    _ensure_key_dir(path)
    staging = path.with_name(path.name + ".new")
    # A staging file only survives a rotation whose transaction rolled back: it was never registered.
    staging.unlink(missing_ok=True)
    new_key = generate_private_key()
    save_private_key(new_key, staging)
    try:
        with transaction.atomic():
            retired = _retire_active()
            row = SigningKey.objects.create(key_id=key_id(new_key), public_key=public_key_b64(new_key),
                                            status=SigningKeyStatus.ACTIVE)
            audit_record(action="signing_key.rotated", actor=actor, target=f"signing_key:{row.key_id}",
                         data={"new_key_id": row.key_id, "retired_key_id": retired})
            # Inside the transaction: if the file cannot be replaced, the new row is rolled back.
            os.replace(staging, path)
    finally:
        staging.unlink(missing_ok=True)
    log.info("signing key rotated: %s active, %s retired", row.key_id, retired or "none")
    return row


def signing_key_adopt(*, actor: object = None) -> SigningKey:
    """Make the key now in the key file the active one (an operator provisioned it from a vault)."""
    private_key = _private_key(create=False)
    identifier = key_id(private_key)
    existing = SigningKey.objects.filter(key_id=identifier).first()
    if existing is not None and existing.status == SigningKeyStatus.ACTIVE:
        return existing
    if existing is not None:
        raise SigningKeyError(f"key {identifier} is {existing.status}; a retired or revoked key never signs "
                              "again. Put a new key in the file (`python -m proof keygen`).")
    with transaction.atomic():
        retired = _retire_active()
        row = SigningKey.objects.create(key_id=identifier, public_key=public_key_b64(private_key),
                                        status=SigningKeyStatus.ACTIVE)
        audit_record(action="signing_key.adopted", actor=actor, target=f"signing_key:{identifier}",
                     data={"new_key_id": identifier, "retired_key_id": retired})
    return row


def signing_key_revoke(*, key_id: str, reason: str, actor: object = None) -> SigningKey:
    """Revoke a key: from now on nothing it signed verifies. Revoking the active key stops signing
    until `signing_key rotate` creates a new one."""
    if not reason.strip():
        raise SigningKeyError("say why the key is revoked (e.g. 'key file leaked in backup 2026-11-30').")
    row = SigningKey.objects.filter(key_id=key_id).first()
    if row is None:
        known = ", ".join(SigningKey.objects.values_list("key_id", flat=True)) or "none"
        raise SigningKeyError(f"no signing key {key_id!r}; known keys: {known}.")
    with transaction.atomic():
        changed = SigningKey.objects.filter(pk=row.pk).exclude(status=SigningKeyStatus.REVOKED).update(
            status=SigningKeyStatus.REVOKED, revoked_at=timezone.now())
        if changed:
            audit_record(action="signing_key.revoked", actor=actor, target=f"signing_key:{key_id}",
                         data={"key_id": key_id, "was": row.status, "reason": reason.strip()})
    row.refresh_from_db()
    return row


def keys_document() -> dict:
    """The public keys document `{"keys": [...]}` served at /.well-known/dyno-report-keys.json."""
    entries = tuple(
        PublishedKey(key_id=row.key_id,
                     public_key=Ed25519PublicKey.from_public_bytes(base64.b64decode(row.public_key)),
                     status=KeyStatus(row.status))
        for row in SigningKey.objects.order_by("created_at", "id"))
    return KeyRing(keys=entries).to_document()


def _retire_active() -> str | None:
    active = SigningKey.objects.select_for_update().filter(status=SigningKeyStatus.ACTIVE).first()
    if active is None:
        return None
    SigningKey.objects.filter(pk=active.pk, status=SigningKeyStatus.ACTIVE).update(
        status=SigningKeyStatus.RETIRED, retired_at=timezone.now())
    return active.key_id


def _register_first_key(private_key: Ed25519PrivateKey) -> SigningKey:
    identifier = key_id(private_key)
    if SigningKey.objects.exists():
        active = SigningKey.objects.filter(status=SigningKeyStatus.ACTIVE).values_list("key_id", flat=True).first()
        raise SigningKeyError(
            f"the key in {signing_key_path()} ({identifier}) is not a registered signing key (the active one "
            f"is {active or 'none'}). Restore the right key file, or run `manage.py signing_key adopt` to make "
            "this file's key the active one.")
    try:
        with transaction.atomic():
            row = SigningKey.objects.create(key_id=identifier, public_key=public_key_b64(private_key),
                                            status=SigningKeyStatus.ACTIVE)
            audit_record(action="signing_key.registered", target=f"signing_key:{identifier}",
                         data={"key_id": identifier, "path": str(signing_key_path())})
    except IntegrityError:
        # Another process registered the same key file at the same moment.
        row = SigningKey.objects.get(key_id=identifier)
    return row


def _private_key(*, create: bool = True) -> Ed25519PrivateKey:
    path = signing_key_path()
    if not path.exists():
        if not create or getattr(settings, "PRODUCTION", False):
            raise SigningKeyError(
                f"no signing key at {path}: create one with `python -m proof keygen --out {path}` "
                "and register it with `manage.py signing_key adopt` (or set DYNO_SIGNING_KEY_PATH).")
        _ensure_key_dir(path)
        try:
            save_private_key(generate_private_key(), path)
            log.info("created a development signing key at %s", path)
        except FileExistsError:
            pass  # another process created it first; use theirs
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise SigningKeyError(f"{path} is readable by others (mode {mode:o}); run `chmod 600 {path}` first.")
    return load_private_key(path)


def _ensure_key_dir(path: Path) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
