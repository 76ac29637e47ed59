"""The audit log is keyed: each event's digest is an HMAC under a key outside the database, so
whoever can write the table (triggers off, digests recomputed) still cannot rewrite history
unnoticed; events from before keying still verify, pinned by the first keyed event."""

from __future__ import annotations

import importlib
import stat
from io import StringIO

import pytest
from django.apps import apps
from django.core.management import CommandError, call_command
from django.db import connection
from django.utils import timezone

from auditlog.chain import GENESIS, KEYED, UNKEYED, event_digest
from auditlog.checks import audit_key_present
from auditlog.keys import AuditKeyError
from auditlog.models import AuditChainHead, AuditEvent
from auditlog.services import audit_record, audit_verify_chain

pytestmark = pytest.mark.django_db

append_marker = importlib.import_module("auditlog.migrations.0004_keyed_marker").append_marker


@pytest.fixture
def key_path(settings, tmp_path):
    settings.DYNO_AUDIT_KEY_PATH = tmp_path / "keys" / "audit-hmac.key"
    return settings.DYNO_AUDIT_KEY_PATH


def _rewrite(rows: list[dict]) -> None:
    """What an attacker with write access does: triggers off, rows and head replaced."""
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE auditlog_auditevent DISABLE TRIGGER auditlog_append_only")
        try:
            for row in rows:
                AuditEvent.objects.filter(seq=row["seq"]).update(**{k: v for k, v in row.items() if k != "seq"})
        finally:
            cursor.execute("ALTER TABLE auditlog_auditevent ENABLE TRIGGER auditlog_append_only")
    last = AuditEvent.objects.order_by("-seq").first()
    AuditChainHead.objects.filter(pk=1).update(seq=last.seq, last_hash=last.hash)


def _rechained(*, scheme: int, key: bytes | None, changes: dict[int, dict]) -> list[dict]:
    """Every event again with `changes` applied, each digest recomputed under `scheme` and `key`."""
    rows, prev = [], GENESIS
    for event in AuditEvent.objects.order_by("seq"):
        data = changes.get(event.seq, {}).get("data", event.data)
        digest = event_digest(scheme=scheme, key=key, seq=event.seq, at=event.at.isoformat(), action=event.action,
                              actor=event.actor, organization_id=event.organization_id, target=event.target,
                              data=data, prev_hash=prev)
        rows.append({"seq": event.seq, "data": data, "prev_hash": prev, "hash": digest, "scheme": scheme})
        prev = digest
    return rows


def test_it_keys_every_event_with_a_key_kept_outside_the_database(key_path):
    event = audit_record(action="test.event", data={"i": 1})
    assert event.scheme == KEYED
    assert stat.S_IMODE(key_path.stat().st_mode) == 0o600
    plain = event_digest(scheme=UNKEYED, key=None, seq=event.seq, at=event.at.isoformat(), action=event.action,
                         actor=event.actor, organization_id=None, target="", data={"i": 1}, prev_hash=GENESIS)
    assert event.hash != plain  # not recomputable from the row alone
    out = StringIO()
    call_command("verify_auditlog", stdout=out)
    assert "intact: 1 events (1 keyed, 0 from before keying; key " in out.getvalue()


def test_it_detects_a_rewrite_whose_digests_were_recomputed_without_the_key(key_path):
    for i in range(4):
        audit_record(action="test.event", data={"i": i})
    _rewrite(_rechained(scheme=KEYED, key=b"a guess at the key, 32 characters+", changes={2: {"data": {"i": 99}}}))
    check = audit_verify_chain()
    assert not check.ok and check.events == 0 and "event 1 (test.event) was altered" in check.problem
    with pytest.raises(CommandError, match="BROKEN"):
        call_command("verify_auditlog")


def test_it_detects_a_keyed_chain_rewritten_as_unkeyed(key_path):
    for i in range(3):
        audit_record(action="test.event", data={"i": i})
    # The old attack: the whole chain recomputed with plain SHA-256, as before keying.
    _rewrite(_rechained(scheme=UNKEYED, key=None, changes={2: {"data": {"i": 99}}}))
    check = audit_verify_chain()
    assert not check.ok and "all unkeyed" in check.problem


def test_it_refuses_unkeyed_events_after_keyed_ones(key_path):
    for i in range(3):
        audit_record(action="test.event", data={"i": i})
    second, third = AuditEvent.objects.get(seq=2), AuditEvent.objects.get(seq=3)
    # Event 3 alone rewritten unkeyed, linked to the real event 2: the cheapest forgery of the newest event.
    forged = event_digest(scheme=UNKEYED, key=None, seq=3, at=third.at.isoformat(), action=third.action,
                          actor=third.actor, organization_id=None, target="", data={"i": 99}, prev_hash=second.hash)
    _rewrite([{"seq": 3, "data": {"i": 99}, "hash": forged, "scheme": UNKEYED}])
    check = audit_verify_chain()
    assert not check.ok and check.events == 2 and "event 3 (test.event) is unkeyed after keyed" in check.problem


def _unkeyed_history(count: int) -> None:
    """Events as the log wrote them before it was keyed (plain SHA-256)."""
    prev = GENESIS
    for seq in range(1, count + 1):
        at = timezone.now()
        fields = dict(seq=seq, at=at.isoformat(), action="old.event", actor="system", organization_id=None,
                      target="", data={"n": seq}, prev_hash=prev)
        digest = event_digest(scheme=UNKEYED, key=None, **fields)
        AuditEvent.objects.create(seq=seq, at=at, action="old.event", actor="system", data={"n": seq},
                                  prev_hash=prev, hash=digest, scheme=UNKEYED)
        prev = digest
    AuditChainHead.objects.update_or_create(pk=1, defaults={"seq": count, "last_hash": prev})


def test_events_written_before_keying_still_verify_and_are_pinned_by_the_marker(key_path):
    _unkeyed_history(3)
    append_marker(apps, None)  # what migration auditlog 0004 does on an existing log
    audit_record(action="test.event")
    check = audit_verify_chain()
    assert check.ok and (check.events, check.unkeyed) == (5, 3)
    marker = AuditEvent.objects.get(seq=4)
    assert (marker.action, marker.scheme, marker.data["unkeyed_events"]) == ("auditlog.keyed", KEYED, 3)

    # Rewriting the unkeyed part, digests recomputed, breaks the link into the keyed marker.
    rows = _rechained(scheme=UNKEYED, key=None, changes={2: {"data": {"n": 99}}})[:3]
    _rewrite(rows)
    AuditChainHead.objects.filter(pk=1).update(seq=5, last_hash=AuditEvent.objects.get(seq=5).hash)
    check = audit_verify_chain()
    assert not check.ok and "event 4 does not link to event 3" in check.problem


def test_an_empty_log_needs_no_marker(key_path):
    append_marker(apps, None)
    assert not AuditEvent.objects.exists() and audit_verify_chain().ok


def test_production_never_makes_up_a_key(key_path, settings):
    settings.PRODUCTION = True
    with pytest.raises(AuditKeyError, match="no audit log key"):
        audit_record(action="test.event")
    assert [e.id for e in audit_key_present()] == ["auditlog.E001"]
    key_path.parent.mkdir(parents=True)
    key_path.write_text("f" * 64)
    key_path.chmod(0o600)
    assert audit_key_present() == [] and audit_record(action="test.event").scheme == KEYED


def test_development_does_not_replace_a_key_that_keyed_events(key_path):
    audit_record(action="test.event")
    key_path.unlink()
    with pytest.raises(AuditKeyError, match="key that keyed this database's events is missing"):
        audit_record(action="test.event")
    assert not key_path.exists()
    with pytest.raises(CommandError, match="cannot check keyed events"):
        call_command("verify_auditlog")


def test_it_refuses_a_key_others_can_read(key_path):
    audit_record(action="test.event")
    key_path.chmod(0o644)
    with pytest.raises(AuditKeyError, match="chmod 600"):
        audit_record(action="test.event")


def _truncate_to(seq: int) -> None:
    """An attacker with write access cuts the newest events off and sets the head back: what is left
    still verifies on its own."""
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE auditlog_auditevent DISABLE TRIGGER auditlog_append_only")
        try:
            AuditEvent.objects.filter(seq__gt=seq).delete()
        finally:
            cursor.execute("ALTER TABLE auditlog_auditevent ENABLE TRIGGER auditlog_append_only")
    last = AuditEvent.objects.get(seq=seq)
    AuditChainHead.objects.filter(pk=1).update(seq=last.seq, last_hash=last.hash)


def test_a_signed_checkpoint_kept_elsewhere_catches_a_truncated_log(key_path, settings, tmp_path):
    settings.DYNO_SIGNING_KEY_PATH = str(tmp_path / "keys" / "report-signing.pem")
    for index in range(4):
        audit_record(action="test.event", target=f"t:{index}")
    out = tmp_path / "offsite"
    call_command("auditlog_checkpoint", "--out", str(out), stdout=StringIO())
    (checkpoint,) = out.glob("checkpoint-*.json")
    report = StringIO()
    call_command("verify_auditlog", "--checkpoint", str(checkpoint), stdout=report)
    assert "intact" in report.getvalue() and "holds 1 checkpoint" in report.getvalue()
    audit_record(action="test.event", target="t:after")  # later events are fine
    call_command("verify_auditlog", "--checkpoint", str(checkpoint), stdout=StringIO())
    _truncate_to(2)
    assert audit_verify_chain().ok  # the chain alone cannot tell
    with pytest.raises(CommandError, match="chain ends at event 2: events were removed"):
        call_command("verify_auditlog", "--checkpoint", str(checkpoint), stdout=StringIO())


def test_a_checkpoint_is_not_a_report_and_cannot_be_forged(key_path, settings, tmp_path):
    import json

    from auditlog.checkpoint import checkpoint_make, checkpoint_problem
    from reports.signing import keys_document, report_sign

    settings.DYNO_SIGNING_KEY_PATH = str(tmp_path / "keys" / "report-signing.pem")
    audit_record(action="test.event", target="t:0")
    document = checkpoint_make()
    keys = keys_document()
    assert checkpoint_problem(document, keys) is None
    forged = {**document, "checkpoint": {**document["checkpoint"], "seq": 1, "hash": "ab" * 32}}
    assert "does not verify" in checkpoint_problem(forged, keys)
    # The same body signed as a report's bytes (no checkpoint prefix) does not verify as a checkpoint.
    from proof.canonical import canonical_bytes

    as_report = {**document, "signature": report_sign(body=canonical_bytes(document["checkpoint"]))}
    assert "does not verify" in checkpoint_problem(json.loads(json.dumps(as_report)), keys)


def test_beat_writes_the_daily_checkpoint_where_the_operator_keeps_them(key_path, settings, tmp_path):
    import json

    from auditlog.checkpoint import checkpoint_problem
    from auditlog.tasks import auditlog_checkpoint_task
    from reports.signing import keys_document

    settings.DYNO_SIGNING_KEY_PATH = str(tmp_path / "keys" / "report-signing.pem")
    settings.DYNO_AUDIT_CHECKPOINT_DIR = tmp_path / "offsite"
    audit_record(action="test.event", target="t:0")
    written = auditlog_checkpoint_task.apply().get()
    document = json.loads(open(written).read())
    # Signing with a new key records that key first; the checkpoint holds what came before it.
    assert 1 <= document["checkpoint"]["seq"] <= AuditChainHead.objects.get(pk=1).seq
    assert checkpoint_problem(document, keys_document()) is None
    assert "auditlog-checkpoint" in settings.CELERY_BEAT_SCHEDULE
