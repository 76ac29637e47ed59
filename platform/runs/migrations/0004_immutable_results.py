"""PostgreSQL keeps a run's stored result immutable, not only Python and the admin.

Once a run has a result (stored with status=succeeded in one transaction), its figures, artifact,
the candidate it measured and what it measured it on never change, and the run is never deleted:
signed reports are made from these rows and a re-audit is a new run. Workload rows are written
once, with the result, and never updated or deleted. TRUNCATE is left to privileges, as for the
audit log (the test runner's flush).
"""

from django.db import migrations

FROZEN = (
    "result", "artifact", "artifact_sha256", "model_speedup", "model_ci_low", "model_ci_high", "stable",
    "verdict", "workload", "candidate_source", "candidate_sha256", "hardware", "profile", "batch", "seq",
    "kind", "organization_id", "model_version_id",
)
CHANGED = " OR ".join(f"NEW.{column} IS DISTINCT FROM OLD.{column}" for column in FROZEN)

CREATE = f"""
CREATE OR REPLACE FUNCTION runs_guard_stored_result() RETURNS trigger AS $$
BEGIN
    IF OLD.result IS NULL THEN
        IF TG_OP = 'DELETE' THEN
            RETURN OLD;
        END IF;
        RETURN NEW;
    END IF;
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'run % has a stored result: DELETE refused on runs_run', OLD.id
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF {CHANGED} THEN
        RAISE EXCEPTION 'run % has a stored result: its figures, artifact and subject never change (a re-audit is a new run)', OLD.id
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER runs_run_result_immutable BEFORE UPDATE OR DELETE ON runs_run
    FOR EACH ROW EXECUTE FUNCTION runs_guard_stored_result();

CREATE OR REPLACE FUNCTION runs_refuse_workload_result_change() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'workload results are stored once with their run: % refused on runs_workloadresult', TG_OP
        USING ERRCODE = 'integrity_constraint_violation';
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER runs_workloadresult_immutable BEFORE UPDATE OR DELETE ON runs_workloadresult
    FOR EACH ROW EXECUTE FUNCTION runs_refuse_workload_result_change();
"""
DROP = """
DROP TRIGGER IF EXISTS runs_run_result_immutable ON runs_run;
DROP FUNCTION IF EXISTS runs_guard_stored_result();
DROP TRIGGER IF EXISTS runs_workloadresult_immutable ON runs_workloadresult;
DROP FUNCTION IF EXISTS runs_refuse_workload_result_change();
"""


def forwards(apps, schema_editor) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE, params=None)


def backwards(apps, schema_editor) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP, params=None)


class Migration(migrations.Migration):
    dependencies = [("runs", "0003_audits")]
    operations = [migrations.RunPython(forwards, backwards)]
