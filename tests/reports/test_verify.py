"""The public /verify page and the standalone verifier (`python -m proof verify`),
both fed the bytes the platform serves: valid, changed bytes, changed signature, unknown key,
revoked key, retired key."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from reports.signing import signing_key_revoke, signing_key_rotate

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parents[2]


def _download(client, report, raw_key: str) -> tuple[bytes, bytes, bytes]:
    auth = {"HTTP_AUTHORIZATION": f"Bearer {raw_key}"}
    body = client.get(f"/api/v1/reports/{report.pk}", **auth).content
    signature = client.get(f"/api/v1/reports/{report.pk}/signature", **auth).content
    keys = client.get("/.well-known/dyno-report-keys.json").content
    return body, signature, keys


def _verify_page(client, body: bytes, signature: bytes):
    return client.post("/verify", {"report": SimpleUploadedFile("report.json", body),
                                   "signature": SimpleUploadedFile("report.sig.json", signature)})


def _flip(data: bytes, position: int) -> bytes:
    changed = bytearray(data)
    changed[position] ^= 0x01
    return bytes(changed)


def _other_signature(original: bytes, **changes: str) -> bytes:
    document = json.loads(original)
    document.update(changes)
    return json.dumps(document).encode()


def test_the_verify_page_needs_no_sign_in_and_tells_valid_from_tampered(client, make_org, make_report, make_key):
    acme = make_org("acme")
    report = make_report(acme)
    body, signature, _ = _download(client, report, make_key(acme, "auditor"))
    assert client.get("/verify").status_code == 200
    valid = _verify_page(client, body, signature)
    assert valid.status_code == 200 and "Valid." in valid.content.decode()

    changed = _verify_page(client, _flip(body, len(body) // 2), signature)
    assert changed.status_code == 422 and "bad_signature" in changed.content.decode()

    raw = bytearray(base64.b64decode(json.loads(signature)["signature"]))
    raw[0] ^= 0x01
    forged = _other_signature(signature, signature=base64.b64encode(bytes(raw)).decode())
    assert "bad_signature" in _verify_page(client, body, forged).content.decode()

    unknown = _verify_page(client, body, _other_signature(signature, key_id="00000000deadbeef"))
    assert unknown.status_code == 422 and "unknown_key" in unknown.content.decode()

    garbage = _verify_page(client, body, b"not json")
    assert garbage.status_code == 422 and "malformed_signature" in garbage.content.decode()
    assert client.post("/verify", {}).status_code == 400


def test_the_verify_page_follows_rotation_and_revocation(client, make_org, make_report, make_key):
    acme = make_org("acme")
    report = make_report(acme)
    body, signature, _ = _download(client, report, make_key(acme, "customer"))
    signing_key_rotate(actor="test")
    retired = _verify_page(client, body, signature)
    assert retired.status_code == 200 and "retired key" in retired.content.decode()
    signing_key_revoke(key_id=report.key_id, reason="test", actor="test")
    revoked = _verify_page(client, body, signature)
    assert revoked.status_code == 422 and "revoked_key" in revoked.content.decode()


def _cli(tmp_path: Path, body: bytes, signature: bytes, keys: bytes) -> subprocess.CompletedProcess:
    (tmp_path / "report.json").write_bytes(body)
    (tmp_path / "report.sig.json").write_bytes(signature)
    (tmp_path / "keys.json").write_bytes(keys)
    return subprocess.run([sys.executable, "-m", "proof.signature", "verify", "report.json", "report.sig.json",
                           "--keys", "keys.json"], cwd=tmp_path, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin"},
                          capture_output=True, text=True, timeout=60)


def test_the_standalone_verifier_checks_what_the_platform_serves(client, make_org, make_report, make_key, tmp_path):
    acme = make_org("acme")
    report = make_report(acme)
    body, signature, keys = _download(client, report, make_key(acme, "auditor"))

    valid = _cli(tmp_path, body, signature, keys)
    assert valid.returncode == 0 and valid.stdout.startswith("VALID"), valid.stdout + valid.stderr

    tampered = _cli(tmp_path, _flip(body, 10), signature, keys)
    assert tampered.returncode == 1 and "bad_signature" in tampered.stdout

    unknown = _cli(tmp_path, body, _other_signature(signature, key_id="00000000deadbeef"), keys)
    assert unknown.returncode == 1 and "unknown_key" in unknown.stdout

    signing_key_rotate(actor="test")
    retired = _cli(tmp_path, body, signature, client.get("/.well-known/dyno-report-keys.json").content)
    assert retired.returncode == 0 and "retired key" in retired.stdout

    signing_key_revoke(key_id=report.key_id, reason="test", actor="test")
    revoked_keys = client.get("/.well-known/dyno-report-keys.json").content
    revoked = _cli(tmp_path, body, signature, revoked_keys)
    assert revoked.returncode == 1 and "revoked_key" in revoked.stdout


def test_the_standalone_verifier_accepts_the_web_downloads(client, make_org, make_report, tmp_path):
    acme = make_org("acme", owner="owner@acme.test")
    report = make_report(acme)
    client.login(username="owner@acme.test", password="correct-horse-battery")
    body = client.get(f"/reports/{report.pk}/report.json").content
    signature = client.get(f"/reports/{report.pk}/signature.json").content
    keys = client.get("/.well-known/dyno-report-keys.json").content
    outcome = _cli(tmp_path, body, signature, keys)
    assert outcome.returncode == 0, outcome.stdout + outcome.stderr
