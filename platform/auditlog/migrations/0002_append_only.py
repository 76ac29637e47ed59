"""PostgreSQL refuses UPDATE and DELETE on audit events: append-only in the database, not only in Python.

TRUNCATE is left to privileges (the test runner's flush needs it); production's application role
should not hold TRUNCATE on this table (README, Production).
"""

from django.db import migrations

CREATE = """
CREATE OR REPLACE FUNCTION auditlog_refuse_change() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'audit events are append-only: % refused on auditlog_auditevent', TG_OP
        USING ERRCODE = 'integrity_constraint_violation';
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER auditlog_append_only BEFORE UPDATE OR DELETE ON auditlog_auditevent
    FOR EACH ROW EXECUTE FUNCTION auditlog_refuse_change();
"""
DROP = """
DROP TRIGGER IF EXISTS auditlog_append_only ON auditlog_auditevent;
DROP FUNCTION IF EXISTS auditlog_refuse_change();
"""


def forwards(apps, schema_editor) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE, params=None)


def backwards(apps, schema_editor) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP, params=None)


class Migration(migrations.Migration):
    dependencies = [("auditlog", "0001_initial")]
    operations = [migrations.RunPython(forwards, backwards)]
