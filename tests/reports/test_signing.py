"""Signing reports: creation, sign-then-verify through the service, tampering, key rotation and
revocation, key file handling, idempotency and the database guards."""

from __future__ import annotations

import base64
import hashlib
import json
import stat
from decimal import Decimal

import pytest
from django.db import IntegrityError, InternalError, transaction

from auditlog.models import AuditEvent
from reports.models import Report, SigningKey
from reports.selectors import report_verify
from reports.services import report_body_bytes, report_create_for_run
from reports.signing import SigningKeyError, keys_document, signing_key_revoke, signing_key_rotate
from proof.signature import verify
from tests.reports.builders import synthetic_result

pytestmark = pytest.mark.django_db


def test_it_signs_a_succeeded_run_and_the_signature_verifies(make_org, make_report, signing_key_path):
    report = make_report(make_org("acme"))
    body = report.body_bytes
    assert hashlib.sha256(body).hexdigest() == report.body_sha256
    assert json.loads(body)["schema"] == "dyno.report/1"
    assert report.model_ci_low == Decimal("1.22") and report.stable
    result = report_verify(report=report)
    assert result.valid, result.message
    assert stat.S_IMODE(signing_key_path.stat().st_mode) == 0o600
    assert AuditEvent.objects.filter(action="report.created", target=f"report:{report.pk}").exists()
    assert AuditEvent.objects.filter(action="signing_key.registered").count() == 1


def test_it_fails_verification_for_any_changed_byte(make_org, make_report):
    report = make_report(make_org("acme"))
    body, keys = report.body_bytes, keys_document()
    signature = {"key_id": report.key_id, "algorithm": "ed25519", "signature": report.signature}
    positions = sorted({0, 1, len(body) // 3, len(body) // 2, len(body) - 2, len(body) - 1,
                        *range(17, len(body), max(1, len(body) // 40))})
    for position in positions:
        changed = bytearray(body)
        changed[position] ^= 0x01
        outcome = verify(bytes(changed), signature, keys)
        assert not outcome.valid and outcome.reason == "bad_signature", position
    assert not verify(body + b" ", signature, keys).valid


def test_it_fails_verification_for_a_changed_signature_or_unknown_key(make_org, make_report):
    report = make_report(make_org("acme"))
    keys = keys_document()
    raw = bytearray(base64.b64decode(report.signature))
    raw[5] ^= 0x80
    forged = {"key_id": report.key_id, "algorithm": "ed25519", "signature": base64.b64encode(bytes(raw)).decode()}
    assert verify(report.body_bytes, forged, keys).reason == "bad_signature"
    unknown = {"key_id": "0123456789abcdef", "algorithm": "ed25519", "signature": report.signature}
    assert verify(report.body_bytes, unknown, keys).reason == "unknown_key"


def test_it_keeps_retired_keys_verifying_and_signs_with_the_new_key(make_org, make_report, signing_key_path):
    acme = make_org("acme")
    old = make_report(acme)
    old_pem = signing_key_path.read_bytes()
    new_key = signing_key_rotate(actor="test")
    assert signing_key_path.read_bytes() != old_pem  # the retired private key is gone
    assert stat.S_IMODE(signing_key_path.stat().st_mode) == 0o600
    statuses = {k["key_id"]: k["status"] for k in keys_document()["keys"]}
    assert statuses == {old.key_id: "retired", new_key.key_id: "active"}
    assert report_verify(report=old).valid
    newer = make_report(acme, result=synthetic_result(seed=3))
    assert newer.key_id == new_key.key_id and report_verify(report=newer).valid
    assert AuditEvent.objects.filter(action="signing_key.rotated").exists()


def test_it_makes_a_revoked_key_verify_nothing_and_refuses_to_sign_with_it(make_org, make_report):
    acme = make_org("acme")
    report = make_report(acme)
    signing_key_revoke(key_id=report.key_id, reason="leaked in a backup", actor="test")
    outcome = report_verify(report=report)
    assert not outcome.valid and outcome.reason == "revoked_key"
    with pytest.raises(SigningKeyError, match="signing_key rotate"):
        make_report(acme, result=synthetic_result(seed=4))
    signing_key_rotate(actor="test")
    assert report_verify(report=make_report(acme, result=synthetic_result(seed=5))).valid
    assert not report_verify(report=report).valid  # rotation does not bring a revoked key back
    assert AuditEvent.objects.filter(action="signing_key.revoked", data__reason="leaked in a backup").exists()


def test_it_refuses_a_key_file_others_can_read(make_org, make_report, signing_key_path):
    acme = make_org("acme")
    make_report(acme)
    signing_key_path.chmod(0o644)
    with pytest.raises(SigningKeyError, match="chmod 600"):
        make_report(acme, result=synthetic_result(seed=9))


def test_it_makes_one_report_per_run(make_org, make_run):
    run = make_run(make_org("acme"))
    first = report_create_for_run(run=run)
    assert report_create_for_run(run=run).pk == first.pk
    assert Report.objects.filter(run=run).count() == 1
    with pytest.raises(IntegrityError), transaction.atomic():
        Report.objects.create(organization=first.organization, kind="run", run=run, hardware="cpu", body=b"{}",
                              body_sha256="00" * 32, key_id=first.key_id, signature=first.signature)


def test_the_task_signs_once_however_often_it_is_delivered(make_org, make_run):
    from reports.tasks import report_create

    run = make_run(make_org("acme"))
    first = report_create.apply(args=[str(run.pk)]).get()
    assert report_create.apply(args=[str(run.pk)]).get() == first
    assert Report.objects.get(run=run).pk.hex == first.replace("-", "")


def test_it_rebuilds_the_same_bytes_for_the_same_run(make_org, make_run):
    run = make_run(make_org("acme"))
    report = report_create_for_run(run=run)
    assert report_body_bytes(run=run, kind="run") == report.body_bytes
    assert report_body_bytes(run=run, kind="run") == report_body_bytes(run=run, kind="run")


def test_it_refuses_a_run_that_did_not_succeed(make_org, make_run):
    from reports.document import ReportError
    from runs.models import Run

    run = make_run(make_org("acme"))
    Run.objects.filter(pk=run.pk).update(status="failed")
    run.refresh_from_db()
    with pytest.raises(ReportError, match="only a succeeded run"):
        report_create_for_run(run=run)


def test_it_makes_an_audit_report_for_an_audit_result(make_org, make_report):
    report = make_report(make_org("acme"), result=synthetic_result(verdict="accepted"))
    assert report.kind == "audit" and json.loads(report.body_bytes)["verdict"] == "accepted"


def test_the_database_keeps_reports_immutable_and_revocation_final(make_org, make_report):
    report = make_report(make_org("acme"))
    with pytest.raises((IntegrityError, InternalError)), transaction.atomic():
        Report.objects.filter(pk=report.pk).update(model_ci_low="9.9")
    with pytest.raises((IntegrityError, InternalError)), transaction.atomic():
        Report.objects.filter(pk=report.pk).delete()
    signing_key_revoke(key_id=report.key_id, reason="test", actor="test")
    with pytest.raises((IntegrityError, InternalError)), transaction.atomic():
        SigningKey.objects.filter(key_id=report.key_id).update(status="retired", revoked_at=None)
    with pytest.raises((IntegrityError, InternalError)), transaction.atomic():
        SigningKey.objects.filter(key_id=report.key_id).delete()


def test_it_never_exposes_the_private_key(make_org, make_report, signing_key_path, client, make_member):
    acme = make_org("acme", owner="owner@acme.test")
    report = make_report(acme)
    from cryptography.hazmat.primitives import serialization

    from proof.signature import load_private_key

    seed = load_private_key(signing_key_path).private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption())
    secrets = [base64.b64encode(seed), seed.hex().encode(),
               b"".join(signing_key_path.read_bytes().splitlines()[1:-1])]
    client.login(username="owner@acme.test", password="correct-horse-battery")
    pages = [client.get(url).content for url in (
        "/.well-known/dyno-report-keys.json", f"/reports/{report.pk}", f"/reports/{report.pk}/report.json",
        f"/reports/{report.pk}/signature.json", "/reports/")]
    pages.append(json.dumps(list(AuditEvent.objects.values("data", "target"))).encode())
    for page in pages:
        for secret in secrets:
            assert secret not in page
