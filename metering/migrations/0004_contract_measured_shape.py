"""The measurement plan pins the shape (batch x sequence) a model is measured and billed at.

The in-force guard of 0002 compares a version's terms when its open end is closed; the shape is a
term, so the guard is replaced with one that compares it too (else closing a version's end could
move its shape)."""

from django.db import migrations, models

_TERMS = (
    "id, organization_id, version, effective_from, revenue_share, prices, minimum_speedup, monthly_cap, "
    "currency, rounding, dispute_window_days, suite_version, suite_manifest_sha256, baseline, created_at, "
    "created_by"
)


def _guard(columns: str) -> str:
    new = "ROW(" + ", ".join(f"NEW.{c.strip()}" for c in columns.split(",")) + ")"
    old = "ROW(" + ", ".join(f"OLD.{c.strip()}" for c in columns.split(",")) + ")"
    return f"""
CREATE OR REPLACE FUNCTION metering_contract_guard() RETURNS trigger AS $$
BEGIN
    IF OLD.effective_from > current_date AND (TG_OP = 'DELETE' OR NEW.effective_from > current_date) THEN
        -- Not in force yet: nothing was billed or agreed under it, so it may still change.
        IF TG_OP = 'DELETE' THEN RETURN OLD; END IF;
        RETURN NEW;
    END IF;
    IF TG_OP = 'UPDATE' AND OLD.effective_to IS NULL AND NEW.effective_to > current_date
       AND {new} IS NOT DISTINCT FROM {old} THEN
        RETURN NEW;  -- closing the open end at a later month, for the next version
    END IF;
    RAISE EXCEPTION 'contract version % of organization % is in force since %: its terms never change (% refused); add a new version from a later month',
        OLD.version, OLD.organization_id, OLD.effective_from, TG_OP
        USING ERRCODE = 'integrity_constraint_violation';
END;
$$ LANGUAGE plpgsql;
"""


def forwards(apps, schema_editor) -> None:
    # PostgreSQL only, as 0002: the demo's SQLite has no such trigger to replace.
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(_guard(_TERMS + ", measured_batch, measured_seq"), params=None)


def backwards(apps, schema_editor) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(_guard(_TERMS), params=None)


class Migration(migrations.Migration):

    dependencies = [
        ('accounts', '0002_signin_devices_window_counters'),
        ('metering', '0003_reissue'),
    ]

    operations = [
        migrations.AddField(
            model_name='contract',
            name='measured_batch',
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='contract',
            name='measured_seq',
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AddConstraint(
            model_name='contract',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('measured_batch__isnull', True), ('measured_seq__isnull', True)), models.Q(('measured_batch__gte', 1), ('measured_seq__gte', 1)), _connector='OR'), name='contract_plan_shape_whole'),
        ),
        migrations.RunPython(forwards, backwards),
    ]
