"""Tests for proof/signature.py: signing report bytes and verifying them offline."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from proof.canonical import canonical_bytes
from proof.signature import (
    KeyRing,
    VerifyReason,
    generate_private_key,
    key_id,
    keys_document,
    load_private_key,
    public_key_b64,
    save_private_key,
    sign,
    verify,
)

REPO_ROOT = Path(__file__).resolve().parents[2]

REPORT = {
    "schema": "dyno.suite-result/1",
    "suite": {"version": "v1", "profile": "cpu-ci", "manifest_sha256": "0" * 64},
    "summary": {"geomean_speedup": 1.31, "accepted": 3, "rejected": 1, "errors": 0},
    "workloads": [{"name": "rmsnorm", "speedup": 1.42, "ci95": [1.38, 1.47]}],
}


@pytest.fixture(scope="module")
def body() -> bytes:
    return canonical_bytes(REPORT)


@pytest.fixture(scope="module")
def key() -> Ed25519PrivateKey:
    return generate_private_key()


@pytest.fixture(scope="module")
def keys_doc(key: Ed25519PrivateKey) -> dict[str, Any]:
    return keys_document([key.public_key()])


def _flip_byte(data: bytes, position: int) -> bytes:
    mutable = bytearray(data)
    mutable[position] ^= 0x01
    return bytes(mutable)


def test_it_verifies_what_it_signed(
    body: bytes, key: Ed25519PrivateKey, keys_doc: dict[str, Any]
) -> None:
    signature_doc = sign(body, key)
    assert signature_doc["algorithm"] == "ed25519"
    assert signature_doc["key_id"] == key_id(key)
    assert len(base64.b64decode(signature_doc["signature"])) == 64
    result = verify(body, signature_doc, keys_doc)
    assert (result.valid, result.reason) == (True, VerifyReason.OK)
    assert result.reason == "ok"
    assert result.key_id == key_id(key)
    assert "active" in result.message


@pytest.mark.parametrize("where", [0, 1, 17, 0.5, -2, -1])
def test_it_fails_when_any_single_byte_of_the_body_changes(
    body: bytes, key: Ed25519PrivateKey, keys_doc: dict[str, Any], where: float
) -> None:
    position = int(len(body) * where) if isinstance(where, float) else where
    signature_doc = sign(body, key)
    result = verify(_flip_byte(body, position), signature_doc, keys_doc)
    assert (result.valid, result.reason) == (False, VerifyReason.BAD_SIGNATURE)
    assert "changed" in result.message


def test_it_fails_when_the_body_is_reformatted_or_extended(
    body: bytes, key: Ed25519PrivateKey, keys_doc: dict[str, Any]
) -> None:
    signature_doc = sign(body, key)
    pretty = json.dumps(json.loads(body), indent=2).encode()
    for altered in (pretty, body + b"\n", body[:-1], b""):
        assert verify(altered, signature_doc, keys_doc).reason == VerifyReason.BAD_SIGNATURE


@pytest.mark.parametrize("position", [0, 31, 63])
def test_it_fails_when_the_signature_changes(
    body: bytes, key: Ed25519PrivateKey, keys_doc: dict[str, Any], position: int
) -> None:
    signature_doc = sign(body, key)
    raw = _flip_byte(base64.b64decode(signature_doc["signature"]), position)
    tampered = {**signature_doc, "signature": base64.b64encode(raw).decode()}
    result = verify(body, tampered, keys_doc)
    assert (result.valid, result.reason) == (False, VerifyReason.BAD_SIGNATURE)


def test_it_fails_when_another_key_signed_under_a_published_key_id(
    body: bytes, key: Ed25519PrivateKey, keys_doc: dict[str, Any]
) -> None:
    impostor = sign(body, generate_private_key())
    forged = {**impostor, "key_id": key_id(key)}
    assert verify(body, forged, keys_doc).reason == VerifyReason.BAD_SIGNATURE


def test_it_reports_an_unknown_key(body: bytes, keys_doc: dict[str, Any]) -> None:
    stranger = generate_private_key()
    result = verify(body, sign(body, stranger), keys_doc)
    assert (result.valid, result.reason) == (False, VerifyReason.UNKNOWN_KEY)
    assert key_id(stranger) in result.message


def test_it_never_verifies_with_a_revoked_key(body: bytes) -> None:
    old, new = generate_private_key(), generate_private_key()
    document = keys_document([old.public_key(), new.public_key()], {key_id(old)})
    # The signature itself is genuine; revocation alone must make it fail.
    result = verify(body, sign(body, old), document)
    assert (result.valid, result.reason) == (False, VerifyReason.REVOKED_KEY)
    assert verify(body, sign(body, new), document).valid


def test_it_still_verifies_reports_signed_by_a_retired_key(body: bytes) -> None:
    old, new = generate_private_key(), generate_private_key()
    signed_before_rotation = sign(body, old)
    document = keys_document([old.public_key(), new.public_key()])
    statuses = {entry["key_id"]: entry["status"] for entry in document["keys"]}
    assert statuses == {key_id(old): "retired", key_id(new): "active"}
    result = verify(body, signed_before_rotation, document)
    assert (result.valid, result.reason) == (True, VerifyReason.OK)
    assert "retired" in result.message


def test_it_publishes_keys_with_the_documented_fields(key: Ed25519PrivateKey) -> None:
    document = keys_document([key.public_key()])
    raw = key.public_key().public_bytes(
        encoding=serialization.Encoding.Raw, format=serialization.PublicFormat.Raw
    )
    assert document == {
        "keys": [
            {
                "key_id": hashlib.sha256(raw).hexdigest()[:16],
                "algorithm": "ed25519",
                "public_key": base64.b64encode(raw).decode(),
                "status": "active",
            }
        ]
    }
    assert public_key_b64(key) == public_key_b64(key.public_key())
    # The document survives a JSON round trip and parses back to the same ring.
    reparsed = KeyRing.from_document(json.loads(json.dumps(document)))
    assert reparsed.to_document() == document


def test_it_can_name_an_active_key_other_than_the_newest() -> None:
    first, second = generate_private_key(), generate_private_key()
    document = keys_document(
        [first.public_key(), second.public_key()], active_key_id=key_id(first)
    )
    assert [entry["status"] for entry in document["keys"]] == ["active", "retired"]


def test_it_refuses_to_revoke_a_key_it_does_not_publish(key: Ed25519PrivateKey) -> None:
    with pytest.raises(ValueError, match="keep revoked public keys in the list"):
        keys_document([key.public_key()], {"0123456789abcdef"})


def test_it_refuses_a_key_listed_twice(key: Ed25519PrivateKey) -> None:
    with pytest.raises(ValueError, match="listed twice"):
        keys_document([key.public_key(), key.public_key()])


def test_it_gives_distinct_stable_key_ids() -> None:
    first, second = generate_private_key(), generate_private_key()
    assert key_id(first) == key_id(first.public_key())
    assert key_id(first) != key_id(second)
    assert len(key_id(first)) == 16 and set(key_id(first)) <= set("0123456789abcdef")


def _non_canonical_padding(text: str) -> str:
    """The same bytes in another base64 text: set an unused low bit of the last data character."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    last = text.rstrip("=")[-1]
    padded = text[: len(text.rstrip("="))]
    changed = padded[:-1] + alphabet[alphabet.index(last) | 1] + text[len(padded):]
    assert base64.b64decode(changed) == base64.b64decode(text) and changed != text
    return changed


@pytest.mark.parametrize(
    "mutate",
    [
        lambda doc: "not an object",
        lambda doc: [doc],
        lambda doc: {k: v for k, v in doc.items() if k != "signature"},
        lambda doc: {**doc, "key_id": 42},
        lambda doc: {**doc, "signature": "!!!not base64!!!"},
        lambda doc: {**doc, "signature": doc["signature"][:-4]},
        lambda doc: {**doc, "signature": base64.b64encode(b"x" * 63).decode()},
        # Same bytes, non-canonical text: padding bits set. One signature, one encoding.
        lambda doc: {**doc, "signature": _non_canonical_padding(doc["signature"])},
    ],
    ids=["string", "list", "missing", "non-string", "garbage", "truncated", "short", "padding"],
)
def test_it_reports_a_malformed_signature_document(
    body: bytes, key: Ed25519PrivateKey, keys_doc: dict[str, Any], mutate: Any
) -> None:
    result = verify(body, mutate(sign(body, key)), keys_doc)
    assert (result.valid, result.reason) == (False, VerifyReason.MALFORMED_SIGNATURE)
    assert "signature" in result.message


def test_it_reports_an_unsupported_algorithm(
    body: bytes, key: Ed25519PrivateKey, keys_doc: dict[str, Any]
) -> None:
    result = verify(body, {**sign(body, key), "algorithm": "rsa-pss"}, keys_doc)
    assert (result.valid, result.reason) == (False, VerifyReason.BAD_ALGORITHM)
    assert "rsa-pss" in result.message


def _entry(document: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return {"keys": [{**document["keys"][0], **changes}]}


@pytest.mark.parametrize(
    ("make_keys_doc", "expected"),
    [
        (lambda doc: None, '"keys" list'),
        (lambda doc: {"keys": "abc"}, '"keys" list'),
        (lambda doc: {"keys": ["abc"]}, "keys[0] must be an object"),
        (lambda doc: _entry(doc, status="paused"), "status is 'paused'"),
        (lambda doc: _entry(doc, algorithm="rsa"), "algorithm 'rsa'"),
        (lambda doc: _entry(doc, public_key="AAAA"), "base64 of 32 raw bytes"),
        (lambda doc: _entry(doc, key_id="0000000000000000"), "does not match its public key"),
        (lambda doc: {"keys": doc["keys"] * 2}, "listed twice"),
    ],
    ids=["null", "not-a-list", "entry", "status", "algorithm", "short-key", "wrong-id", "dup"],
)
def test_it_reports_a_malformed_keys_document(
    body: bytes,
    key: Ed25519PrivateKey,
    keys_doc: dict[str, Any],
    make_keys_doc: Any,
    expected: str,
) -> None:
    result = verify(body, sign(body, key), make_keys_doc(keys_doc))
    assert (result.valid, result.reason) == (False, VerifyReason.MALFORMED_KEYS)
    assert expected in result.message


def test_it_refuses_text_where_bytes_are_signed(key: Ed25519PrivateKey) -> None:
    with pytest.raises(TypeError, match="canonical_bytes"):
        sign("{}", key)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="bytes"):
        verify("{}", {}, {})  # type: ignore[arg-type]


def test_it_saves_keys_readable_by_the_owner_only_and_loads_them_back(tmp_path: Path) -> None:
    key = generate_private_key()
    path = tmp_path / "signing.pem"
    old_umask = os.umask(0)  # even a permissive umask must not widen the mode
    try:
        save_private_key(key, path)
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    loaded = load_private_key(path)
    assert key_id(loaded) == key_id(key)
    assert verify(b"x", sign(b"x", loaded), keys_document([key.public_key()])).valid


def test_it_refuses_to_overwrite_a_key(tmp_path: Path) -> None:
    path = tmp_path / "signing.pem"
    save_private_key(generate_private_key(), path)
    before = path.read_bytes()
    with pytest.raises(FileExistsError, match="refusing to overwrite"):
        save_private_key(generate_private_key(), path)
    assert path.read_bytes() == before


def test_it_refuses_to_load_a_key_that_is_not_ed25519(tmp_path: Path) -> None:
    path = tmp_path / "ec.pem"
    path.write_bytes(
        ec.generate_private_key(ec.SECP256R1()).private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    with pytest.raises(ValueError, match="Ed25519"):
        load_private_key(path)
    path.write_text("not a key")
    with pytest.raises(ValueError, match="not an unencrypted PEM private key"):
        load_private_key(path)


# --- CLI: run as an auditor would, in a fresh interpreter -----------------------------------------


def _cli(*arguments: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "proof", *map(str, arguments)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def signed_files(tmp_path: Path, body: bytes, key: Ed25519PrivateKey) -> dict[str, Path]:
    files = {
        "report": tmp_path / "report.json",
        "signature": tmp_path / "report.sig.json",
        "keys": tmp_path / "keys.json",
    }
    files["report"].write_bytes(body)
    files["signature"].write_text(json.dumps(sign(body, key)))
    files["keys"].write_text(json.dumps(keys_document([key.public_key()])))
    return files


def _verify_cli(
    files: dict[str, Path],
    *,
    report: Path | None = None,
    signature: Path | None = None,
    keys: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    return _cli(
        "verify",
        report or files["report"],
        signature or files["signature"],
        "--keys",
        keys or files["keys"],
    )


def test_it_exits_0_for_a_valid_report(signed_files: dict[str, Path]) -> None:
    completed = _verify_cli(signed_files)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.startswith("VALID (ok)")
    assert completed.stdout.count("\n") == 1


def test_it_keeps_the_command_printed_in_reports_signed_before_the_move(signed_files: dict[str, Path]) -> None:
    """Reports signed before the verifier moved to proof/ print `python -m runners.signature verify`."""
    arguments = ["verify", signed_files["report"], signed_files["signature"], "--keys", signed_files["keys"]]
    completed = subprocess.run([sys.executable, "-m", "runners.signature", *map(str, arguments)],
                               cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.startswith("VALID (ok)")
    signed_files["report"].write_bytes(signed_files["report"].read_bytes().replace(b"1.42", b"1.52"))
    tampered = subprocess.run([sys.executable, "-m", "runners.signature", *map(str, arguments)],
                              cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert tampered.returncode == 1 and tampered.stdout.startswith("INVALID (bad_signature)")


def test_it_exits_1_for_a_tampered_report(signed_files: dict[str, Path]) -> None:
    report = signed_files["report"]
    report.write_bytes(report.read_bytes().replace(b"1.42", b"1.52"))
    completed = _verify_cli(signed_files)
    assert completed.returncode == 1
    assert completed.stdout.startswith("INVALID (bad_signature)")


def test_it_exits_1_for_a_revoked_key(
    signed_files: dict[str, Path], key: Ed25519PrivateKey
) -> None:
    signed_files["keys"].write_text(json.dumps(keys_document([key.public_key()], {key_id(key)})))
    completed = _verify_cli(signed_files)
    assert completed.returncode == 1
    assert "revoked_key" in completed.stdout


def test_it_exits_2_for_unusable_files(signed_files: dict[str, Path], tmp_path: Path) -> None:
    missing = _verify_cli(signed_files, report=tmp_path / "nope.json")
    assert missing.returncode == 2
    assert "cannot read report" in missing.stderr

    not_json = tmp_path / "garbage.json"
    not_json.write_text("{not json")
    garbage = _verify_cli(signed_files, signature=not_json)
    assert garbage.returncode == 2
    assert "is not JSON" in garbage.stderr

    malformed = tmp_path / "malformed.json"
    malformed.write_text(json.dumps({"keys": [{"key_id": "x"}]}))
    bad_keys = _verify_cli(signed_files, keys=malformed)
    assert bad_keys.returncode == 2
    assert "malformed_keys" in bad_keys.stderr

    no_keys_option = _cli("verify", signed_files["report"], signed_files["signature"])
    assert no_keys_option.returncode == 2
    assert "--keys" in no_keys_option.stderr


def test_it_generates_a_key_from_the_command_line(tmp_path: Path) -> None:
    path = tmp_path / "operator.pem"
    completed = _cli("keygen", "--out", path)
    assert completed.returncode == 0, completed.stderr
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert key_id(load_private_key(path)) in completed.stdout
    again = _cli("keygen", "--out", path)
    assert again.returncode == 2
    assert "refusing to overwrite" in again.stderr


def test_it_imports_neither_torch_nor_django() -> None:
    probe = (
        "import sys, proof.signature, proof.canonical; "
        "print(sorted({'torch', 'django', 'celery'} & set(sys.modules)))"
    )
    completed = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == "[]"
