"""Void and reissue: a void invoice keeps its lines, and its usage is billed again once, recorded
by a Reissue row (on a later run's invoice, or on a corrective invoice of the same run).

So a run may hold a void invoice and its corrective invoice for the same organization and
currency (one non-void invoice each), and the corrective invoice's records repeat segments the
run billed before, under their Reissue row. PostgreSQL keeps reissues written once, and refuses a
reissue of an invoice that is not void or onto an invoice of another organization or currency.
"""

import django.db.models.deletion
from django.db import migrations, models

CREATE = """
CREATE TRIGGER metering_reissue_written_once BEFORE UPDATE OR DELETE ON metering_reissue
    FOR EACH ROW EXECUTE FUNCTION
    metering_refuse_change('reissues are written once; a void invoice''s usage is billed again once');

CREATE OR REPLACE FUNCTION metering_reissue_guard() RETURNS trigger AS $$
DECLARE
    voided metering_invoice%ROWTYPE;
    target metering_invoice%ROWTYPE;
BEGIN
    SELECT * INTO voided FROM metering_invoice WHERE id = NEW.voided_id;
    SELECT * INTO target FROM metering_invoice WHERE id = NEW.invoice_id;
    IF voided.status <> 'void' THEN
        RAISE EXCEPTION 'invoice % is %: only a void invoice''s usage is billed again', voided.number, voided.status
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF target.status = 'void' OR target.organization_id <> voided.organization_id
       OR target.currency <> voided.currency THEN
        RAISE EXCEPTION 'the usage of invoice % is billed again on a non-void invoice of its organization and currency',
            voided.number USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER metering_reissue_checked BEFORE INSERT ON metering_reissue
    FOR EACH ROW EXECUTE FUNCTION metering_reissue_guard();
"""

DROP = """
DROP TRIGGER IF EXISTS metering_reissue_checked ON metering_reissue;
DROP FUNCTION IF EXISTS metering_reissue_guard();
DROP TRIGGER IF EXISTS metering_reissue_written_once ON metering_reissue;
"""


def forwards(apps, schema_editor) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE, params=None)


def backwards(apps, schema_editor) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP, params=None)


class Migration(migrations.Migration):
    dependencies = [("metering", "0002_database_rules")]

    operations = [
        migrations.CreateModel(
            name="Reissue",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                ("created_by", models.CharField(blank=True, max_length=254)),
                ("invoice", models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name="reissues",
                                              to="metering.invoice")),
                ("voided", models.OneToOneField(on_delete=django.db.models.deletion.PROTECT, related_name="reissue",
                                                to="metering.invoice")),
            ],
            options={
                "ordering": ["created_at", "id"],
                "constraints": [
                    models.CheckConstraint(condition=models.Q(("voided", models.F("invoice")), _negated=True),
                                           name="reissue_on_another_invoice"),
                ],
            },
        ),
        migrations.RemoveConstraint(model_name="invoice", name="invoice_once_per_run"),
        migrations.AddConstraint(
            model_name="invoice",
            constraint=models.UniqueConstraint(condition=models.Q(("status", "void"), _negated=True),
                                               fields=("run", "organization", "currency"),
                                               name="invoice_once_per_run"),
        ),
        migrations.RemoveConstraint(model_name="billingrecord", name="billing_record_once_per_run"),
        migrations.AddField(
            model_name="billingrecord",
            name="reissue",
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT,
                                    related_name="records", to="metering.reissue"),
        ),
        migrations.AddConstraint(
            model_name="billingrecord",
            constraint=models.UniqueConstraint(condition=models.Q(("reissue__isnull", True)),
                                               fields=("run", "deployment", "report", "usage_period"),
                                               name="billing_record_once_per_run"),
        ),
        migrations.AddConstraint(
            model_name="billingrecord",
            constraint=models.UniqueConstraint(condition=models.Q(("reissue__isnull", False)),
                                               fields=("reissue", "deployment", "report", "usage_period"),
                                               name="billing_record_once_per_reissue"),
        ),
        migrations.RunPython(forwards, backwards),
    ]
