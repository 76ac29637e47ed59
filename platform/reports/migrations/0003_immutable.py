"""PostgreSQL keeps signed reports immutable and revocation final, not only Python.

Reports: UPDATE and DELETE are refused (a correction is a re-audit report that supersedes).
Signing keys: DELETE is refused (a verifier must be told "revoked", never "unknown"), a key's id
and public half never change, a revoked key never changes again, a retired key never becomes
active again. TRUNCATE is left to privileges, as for the audit log (the test runner's flush).
"""

from django.db import migrations

CREATE = """
CREATE OR REPLACE FUNCTION reports_refuse_report_change() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'signed reports are immutable: % refused on reports_report (a re-audit supersedes instead)',
        TG_OP USING ERRCODE = 'integrity_constraint_violation';
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER reports_report_immutable BEFORE UPDATE OR DELETE ON reports_report
    FOR EACH ROW EXECUTE FUNCTION reports_refuse_report_change();

CREATE OR REPLACE FUNCTION reports_guard_signing_key() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'signing keys stay published: DELETE refused on reports_signingkey'
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF NEW.key_id <> OLD.key_id OR NEW.public_key <> OLD.public_key THEN
        RAISE EXCEPTION 'a signing key''s id and public key never change'
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF OLD.status = 'revoked' AND (NEW.status <> 'revoked' OR NEW.revoked_at IS DISTINCT FROM OLD.revoked_at) THEN
        RAISE EXCEPTION 'signing key % is revoked; revocation is final', OLD.key_id
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF OLD.status = 'retired' AND NEW.status = 'active' THEN
        RAISE EXCEPTION 'signing key % is retired; a retired key never signs again', OLD.key_id
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER reports_signingkey_guard BEFORE UPDATE OR DELETE ON reports_signingkey
    FOR EACH ROW EXECUTE FUNCTION reports_guard_signing_key();
"""
DROP = """
DROP TRIGGER IF EXISTS reports_report_immutable ON reports_report;
DROP FUNCTION IF EXISTS reports_refuse_report_change();
DROP TRIGGER IF EXISTS reports_signingkey_guard ON reports_signingkey;
DROP FUNCTION IF EXISTS reports_guard_signing_key();
"""


def forwards(apps, schema_editor) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE, params=None)


def backwards(apps, schema_editor) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP, params=None)


class Migration(migrations.Migration):
    dependencies = [("reports", "0002_disputes_reaudits_constraints")]
    operations = [migrations.RunPython(forwards, backwards)]
