"""Ed25519 signatures over a report's exact bytes, and their offline verification.
Owns signing keys (generate, save, load, identify), the published keys document and the CLI.

A signature is detached: `sign(body, key)` returns `{"key_id", "algorithm", "signature"}` and the
report bytes stay untouched (they are `proof.canonical.canonical_bytes(report)`). The platform
publishes a keys document `{"keys": [{"key_id", "algorithm", "public_key", "status"}]}`; with the
report file, its signature and that document anyone can check authorship without the platform:

    python -m proof verify report.json report.sig.json --keys keys.json

Key status: "active" signs new reports; "retired" (rotated out) still verifies the reports it
signed; "revoked" (compromised or withdrawn) never verifies anything, so a stolen key cannot
vouch for forged reports. Revoked keys stay listed so verifiers can say "revoked", not "unknown".
Needs only `cryptography` and the standard library: it runs on an auditor's laptop.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import hashlib
import json
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

ALGORITHM = "ed25519"
# 16 hex characters = 64 bits of the key's hash: enough to name keys apart, short enough to read.
KEY_ID_HEX_CHARS = 16
PUBLIC_KEY_BYTES = 32
SIGNATURE_BYTES = 64
PRIVATE_KEY_FILE_MODE = 0o600

EXIT_VALID = 0
EXIT_INVALID = 1
EXIT_UNUSABLE = 2


class VerifyReason(StrEnum):
    """Machine-readable outcome of `verify`; `VerifyResult.message` says it for people."""

    OK = "ok"
    BAD_SIGNATURE = "bad_signature"
    UNKNOWN_KEY = "unknown_key"
    REVOKED_KEY = "revoked_key"
    BAD_ALGORITHM = "bad_algorithm"
    MALFORMED_SIGNATURE = "malformed_signature"
    MALFORMED_KEYS = "malformed_keys"


class KeyStatus(StrEnum):
    ACTIVE = "active"
    RETIRED = "retired"
    REVOKED = "revoked"


@dataclass(frozen=True)
class VerifyResult:
    valid: bool
    reason: VerifyReason
    message: str
    # The key the signature names, when the signature document could be read.
    key_id: str | None = None


class DocumentError(ValueError):
    """A signature or keys document cannot be used; `reason` is the VerifyReason verify reports."""

    def __init__(self, reason: VerifyReason, message: str) -> None:
        super().__init__(message)
        self.reason = reason


PublicOrPrivateKey = Ed25519PublicKey | Ed25519PrivateKey


@dataclass(frozen=True)
class PublishedKey:
    key_id: str
    public_key: Ed25519PublicKey
    status: KeyStatus


@dataclass(frozen=True)
class KeyRing:
    """The platform's public keys with their status: what the keys document publishes."""

    keys: tuple[PublishedKey, ...]

    @classmethod
    def from_public_keys(
        cls,
        public_keys: Sequence[Ed25519PublicKey],
        *,
        revoked: Iterable[str] = (),
        active_key_id: str | None = None,
    ) -> KeyRing:
        """Keys in rotation order (oldest first): the last is active unless `active_key_id` says
        otherwise, the others are retired, and any key whose id is in `revoked` is revoked."""
        ids = [key_id(key) for key in public_keys]
        if len(set(ids)) != len(ids):
            raise ValueError("the same public key is listed twice; list each key once")
        if isinstance(revoked, str):
            raise TypeError("revoked is a set of key ids, not one id; pass {key_id}")
        revoked_ids = set(revoked)
        unlisted = sorted(revoked_ids - set(ids))
        if unlisted:
            raise ValueError(
                f"revoked key ids {unlisted} are not among the public keys; keep revoked public "
                "keys in the list so verifiers can report them as revoked rather than unknown"
            )
        if active_key_id is None and ids:
            active_key_id = ids[-1]
        if active_key_id is not None and active_key_id not in ids:
            raise ValueError(f"active key id {active_key_id!r} is not among the public keys")
        entries = []
        for identifier, key in zip(ids, public_keys, strict=True):
            if identifier in revoked_ids:
                status = KeyStatus.REVOKED
            elif identifier == active_key_id:
                status = KeyStatus.ACTIVE
            else:
                status = KeyStatus.RETIRED
            entries.append(PublishedKey(key_id=identifier, public_key=key, status=status))
        return cls(keys=tuple(entries))

    @classmethod
    def from_document(cls, document: Any) -> KeyRing:
        """Parse a published keys document; raises DocumentError(MALFORMED_KEYS) if it isn't."""
        if not isinstance(document, Mapping) or not isinstance(document.get("keys"), list):
            raise _malformed_keys('the keys document must be an object with a "keys" list')
        entries: list[PublishedKey] = []
        seen: set[str] = set()
        for index, entry in enumerate(document["keys"]):
            where = f"keys[{index}]"
            fields = _string_fields(entry, ("key_id", "algorithm", "public_key", "status"))
            if fields is None:
                raise _malformed_keys(
                    f"{where} must be an object with string fields key_id, algorithm, "
                    "public_key and status"
                )
            if fields["algorithm"] != ALGORITHM:
                raise _malformed_keys(
                    f"{where} has algorithm {fields['algorithm']!r}; only {ALGORITHM!r} is known"
                )
            raw = _strict_b64decode(fields["public_key"])
            if raw is None or len(raw) != PUBLIC_KEY_BYTES:
                raise _malformed_keys(
                    f"{where}.public_key must be standard base64 of {PUBLIC_KEY_BYTES} raw bytes"
                )
            if fields["status"] not in {status.value for status in KeyStatus}:
                raise _malformed_keys(
                    f"{where}.status is {fields['status']!r}; expected one of "
                    f"{', '.join(status.value for status in KeyStatus)}"
                )
            public_key = Ed25519PublicKey.from_public_bytes(raw)
            if key_id(public_key) != fields["key_id"]:
                raise _malformed_keys(
                    f"{where}.key_id {fields['key_id']!r} does not match its public key "
                    f"(expected {key_id(public_key)!r}); the document was edited or corrupted"
                )
            if fields["key_id"] in seen:
                raise _malformed_keys(f"{where}: key {fields['key_id']!r} is listed twice")
            seen.add(fields["key_id"])
            entries.append(
                PublishedKey(
                    key_id=fields["key_id"],
                    public_key=public_key,
                    status=KeyStatus(fields["status"]),
                )
            )
        return cls(keys=tuple(entries))

    def to_document(self) -> dict[str, Any]:
        return {
            "keys": [
                {
                    "key_id": entry.key_id,
                    "algorithm": ALGORITHM,
                    "public_key": public_key_b64(entry.public_key),
                    "status": entry.status.value,
                }
                for entry in self.keys
            ]
        }

    def find(self, identifier: str) -> PublishedKey | None:
        for entry in self.keys:
            if entry.key_id == identifier:
                return entry
        return None


def generate_private_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def save_private_key(private_key: Ed25519PrivateKey, path: str | os.PathLike[str]) -> None:
    """Write the key as unencrypted PKCS#8 PEM, readable by its owner only (mode 0600).

    Refuses to overwrite: replacing a signing key by accident would orphan the reports it signed.
    """
    pem = private_key.private_bytes(
        encoding=serialization.Encoding.PEM,
        format=serialization.PrivateFormat.PKCS8,
        encryption_algorithm=serialization.NoEncryption(),
    )
    try:
        # O_EXCL: never follow or replace an existing file; the mode applies from creation on,
        # so the key is never readable by others, even briefly.
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_KEY_FILE_MODE)
    except FileExistsError:
        raise FileExistsError(
            f"{os.fspath(path)} already exists; refusing to overwrite a signing key "
            "(move the old one away first if you really mean to replace it)"
        ) from None
    with os.fdopen(descriptor, "wb") as handle:
        # The umask can only remove bits from the mode above; set it exactly anyway.
        os.fchmod(handle.fileno(), PRIVATE_KEY_FILE_MODE)
        handle.write(pem)
        handle.flush()
        os.fsync(handle.fileno())


def load_private_key(path: str | os.PathLike[str]) -> Ed25519PrivateKey:
    """Read a key written by `save_private_key` (PKCS#8 PEM, unencrypted)."""
    data = Path(path).read_bytes()
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as error:
        raise ValueError(
            f"{os.fspath(path)} is not an unencrypted PEM private key ({error}); create one with "
            "`python -m proof keygen --out PATH`"
        ) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(
            f"{os.fspath(path)} holds a {type(key).__name__}; reports are signed with Ed25519 "
            "keys, create one with `python -m proof keygen --out PATH`"
        )
    return key


def key_id(key: PublicOrPrivateKey) -> str:
    """First 16 hex digits of SHA-256 over the raw 32-byte public key."""
    return hashlib.sha256(_raw_public_bytes(key)).hexdigest()[:KEY_ID_HEX_CHARS]


def public_key_b64(key: PublicOrPrivateKey) -> str:
    """Standard base64 of the raw 32-byte public key, as the keys document publishes it."""
    return base64.b64encode(_raw_public_bytes(key)).decode("ascii")


def sign(body: bytes, private_key: Ed25519PrivateKey) -> dict[str, str]:
    """A detached signature document over exactly `body`."""
    if not isinstance(body, bytes):
        raise TypeError(
            f"sign() takes the report's bytes, not {type(body).__name__}; pass "
            "proof.canonical.canonical_bytes(report)"
        )
    return {
        "key_id": key_id(private_key),
        "algorithm": ALGORITHM,
        "signature": base64.b64encode(private_key.sign(body)).decode("ascii"),
    }


def keys_document(
    public_keys: Sequence[Ed25519PublicKey],
    revoked: Iterable[str] = (),
    *,
    active_key_id: str | None = None,
) -> dict[str, Any]:
    """The document to publish; key order and statuses as in `KeyRing.from_public_keys`."""
    ring = KeyRing.from_public_keys(public_keys, revoked=revoked, active_key_id=active_key_id)
    return ring.to_document()


def verify(body: bytes, signature_doc: Any, keys_doc: Any) -> VerifyResult:
    """Whether `signature_doc` is a signature over exactly `body` by a non-revoked published key.

    Data problems come back as a result with a reason; only a non-bytes body (a caller's bug)
    raises.
    """
    if not isinstance(body, bytes):
        raise TypeError(
            f"verify() takes the report's bytes as read from disk, not {type(body).__name__}"
        )
    try:
        identifier, signature = _parse_signature_doc(signature_doc)
    except DocumentError as error:
        return VerifyResult(valid=False, reason=error.reason, message=str(error))
    try:
        ring = KeyRing.from_document(keys_doc)
    except DocumentError as error:
        return VerifyResult(valid=False, reason=error.reason, message=str(error), key_id=identifier)
    entry = ring.find(identifier)
    if entry is None:
        return VerifyResult(
            valid=False,
            reason=VerifyReason.UNKNOWN_KEY,
            message=f"key {identifier} is not in the keys document; fetch the platform's "
            "current keys document, or the signature did not come from this platform",
            key_id=identifier,
        )
    if entry.status is KeyStatus.REVOKED:
        return VerifyResult(
            valid=False,
            reason=VerifyReason.REVOKED_KEY,
            message=f"key {identifier} is revoked; nothing it signed can be trusted, ask the "
            "platform for a re-signed report",
            key_id=identifier,
        )
    try:
        entry.public_key.verify(signature, body)
    except InvalidSignature:
        return VerifyResult(
            valid=False,
            reason=VerifyReason.BAD_SIGNATURE,
            message=f"signature by key {identifier} does not match these report bytes: the "
            "report was changed (even re-saving or re-formatting it breaks the signature) or the "
            "signature belongs to another report",
            key_id=identifier,
        )
    return VerifyResult(
        valid=True,
        reason=VerifyReason.OK,
        message=f"valid signature by {entry.status.value} key {identifier}",
        key_id=identifier,
    )


def _parse_signature_doc(document: Any) -> tuple[str, bytes]:
    fields = _string_fields(document, ("key_id", "algorithm", "signature"))
    if fields is None:
        raise DocumentError(
            VerifyReason.MALFORMED_SIGNATURE,
            "the signature document must be an object with string fields key_id, algorithm "
            "and signature",
        )
    if fields["algorithm"] != ALGORITHM:
        raise DocumentError(
            VerifyReason.BAD_ALGORITHM,
            f"signature algorithm is {fields['algorithm']!r}; Dyno reports are signed with "
            f"{ALGORITHM!r} only",
        )
    signature = _strict_b64decode(fields["signature"])
    if signature is None or len(signature) != SIGNATURE_BYTES:
        raise DocumentError(
            VerifyReason.MALFORMED_SIGNATURE,
            f"signature must be standard base64 of {SIGNATURE_BYTES} bytes; the signature "
            "file is truncated or corrupted",
        )
    return fields["key_id"], signature


def _string_fields(document: Any, names: tuple[str, ...]) -> dict[str, str] | None:
    """The named fields if `document` is an object holding each as a string, else None."""
    if not isinstance(document, Mapping):
        return None
    values = {name: document.get(name) for name in names}
    if not all(isinstance(value, str) for value in values.values()):
        return None
    return values  # type: ignore[return-value]  # all values checked to be str above


def _strict_b64decode(text: str) -> bytes | None:
    """Standard padded base64, accepting only the canonical encoding (one text per byte string)."""
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None
    if base64.b64encode(raw).decode("ascii") != text:
        return None
    return raw


def _raw_public_bytes(key: PublicOrPrivateKey) -> bytes:
    public = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    if not isinstance(public, Ed25519PublicKey):
        raise TypeError(f"expected an Ed25519 key, got {type(key).__name__}")
    return public.public_bytes(
        encoding=serialization.Encoding.Raw, format=serialization.PublicFormat.Raw
    )


def _malformed_keys(message: str) -> DocumentError:
    return DocumentError(VerifyReason.MALFORMED_KEYS, message)


# --- command line -------------------------------------------------------------------------------


class _Unusable(Exception):
    """An argument or file the CLI cannot work with (exit 2)."""


def _read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_bytes())
    except OSError as error:
        raise _Unusable(f"cannot read {what} {path}: {error.strerror or error}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise _Unusable(f"{what} {path} is not JSON: {error}") from None


def _command_verify(arguments: argparse.Namespace) -> int:
    report_path = Path(arguments.report)
    try:
        body = report_path.read_bytes()
    except OSError as error:
        raise _Unusable(f"cannot read report {report_path}: {error.strerror or error}") from None
    signature_doc = _read_json(Path(arguments.signature), "signature file")
    keys_doc = _read_json(Path(arguments.keys), "keys document")
    result = verify(body, signature_doc, keys_doc)
    if result.reason in (VerifyReason.MALFORMED_SIGNATURE, VerifyReason.MALFORMED_KEYS):
        raise _Unusable(f"{result.reason.value}: {result.message}")
    label = "VALID" if result.valid else "INVALID"
    print(f"{label} ({result.reason.value}): {result.message}")
    return EXIT_VALID if result.valid else EXIT_INVALID


def _command_keygen(arguments: argparse.Namespace) -> int:
    key = generate_private_key()
    try:
        save_private_key(key, arguments.out)
    except FileExistsError as error:
        raise _Unusable(str(error)) from None
    except OSError as error:
        raise _Unusable(f"cannot write {arguments.out}: {error.strerror or error}") from None
    print(
        f"wrote {arguments.out} (mode 0600); key_id {key_id(key)}; public_key "
        f"{public_key_b64(key)} (publish it in the keys document before signing with it)"
    )
    return EXIT_VALID


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m proof",
        description="Verify a signed Dyno report offline, or create a signing key.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    verify_parser = commands.add_parser(
        "verify",
        help="check a report's detached signature",
        description="Exit 0: valid. Exit 1: not a valid signature by a non-revoked published key. "
        "Exit 2: arguments or files unusable (missing, not JSON, malformed documents).",
    )
    verify_parser.add_argument("report", help="the report file, byte for byte as downloaded")
    verify_parser.add_argument("signature", help="the signature JSON file")
    verify_parser.add_argument("--keys", required=True, help="the platform's keys document (JSON)")
    verify_parser.set_defaults(handler=_command_verify)
    keygen_parser = commands.add_parser(
        "keygen", help="create an Ed25519 signing key (operators)"
    )
    keygen_parser.add_argument("--out", required=True, help="where to write the private key")
    keygen_parser.set_defaults(handler=_command_keygen)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    arguments = _parser().parse_args(argv)
    try:
        return arguments.handler(arguments)
    except _Unusable as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_UNUSABLE


if __name__ == "__main__":
    sys.exit(main())
