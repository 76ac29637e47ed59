"""The audit log is a hash chain: verifiable, and append-only in PostgreSQL itself."""

from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, transaction

from auditlog.models import AuditEvent
from auditlog.services import audit_record, audit_verify_chain

pytestmark = pytest.mark.django_db


def test_it_verifies_an_intact_chain():
    for i in range(5):
        audit_record(action="test.event", data={"i": i, "text": "naïve ✓"})
    check = audit_verify_chain()
    assert check.ok and check.events == 5
    out = StringIO()
    call_command("verify_auditlog", stdout=out)
    assert "intact: 5 events" in out.getvalue()


def test_it_refuses_updates_and_deletes_in_the_database():
    event = audit_record(action="test.event")
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        AuditEvent.objects.filter(pk=event.pk).update(action="forged")
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("DELETE FROM auditlog_auditevent")


def test_it_detects_tampering_when_the_trigger_is_bypassed():
    for i in range(3):
        audit_record(action="test.event", data={"i": i})
    with connection.cursor() as cursor:
        # A superuser can disable triggers; the chain still tells.
        cursor.execute("ALTER TABLE auditlog_auditevent DISABLE TRIGGER auditlog_append_only")
        cursor.execute("UPDATE auditlog_auditevent SET data = '{\"i\": 99}' WHERE seq = 2")
        cursor.execute("ALTER TABLE auditlog_auditevent ENABLE TRIGGER auditlog_append_only")
    check = audit_verify_chain()
    assert not check.ok and "event 2" in check.problem
    with pytest.raises(CommandError, match="BROKEN"):
        call_command("verify_auditlog")


def test_it_detects_a_deleted_event():
    for i in range(3):
        audit_record(action="test.event", data={"i": i})
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE auditlog_auditevent DISABLE TRIGGER auditlog_append_only")
        cursor.execute("DELETE FROM auditlog_auditevent WHERE seq = 2")
        cursor.execute("ALTER TABLE auditlog_auditevent ENABLE TRIGGER auditlog_append_only")
    assert "missing" in audit_verify_chain().problem
