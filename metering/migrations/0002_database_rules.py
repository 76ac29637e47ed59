"""PostgreSQL enforces metering's money rules itself, not only Python:

- contract versions of one organization never overlap (an exclusion constraint over their month
  ranges) and a version in force keeps its terms: the one change allowed is closing its open end
  at a later month; versions not yet in force may still change;
- usage events and the report history of deployments are append-only;
- billing runs, billing records, invoice lines, credit notes and their lines are written once;
- an invoice is never deleted and only moves draft -> finalized (number set) -> void;
- a credit never takes a line beyond its fee, and only finalized invoices are credited;
- usage events point at a deployment of their own organization (one composite foreign key);
- periods, contract dates and usage months are first days of months.

TRUNCATE is left to privileges, as for the audit log (the test runner's flush truncates).
btree_gist is a contrib extension shipped with PostgreSQL; creating it needs a role allowed to
(README, Production: create it once as a superuser before migrating if the app role cannot).
"""

from django.db import migrations

WRITTEN_ONCE = {
    "metering_usageevent": "usage events are append-only; a wrong event is corrected with a credit note",
    "metering_deploymentreport": "the report history of a deployment is append-only; switch to a new report instead",
    "metering_billingrun": "billing runs are written once; rerunning a period changes nothing",
    "metering_billingrecord": "billing records are written once; correct them with a credit note",
    "metering_invoiceline": "invoice lines are written once; correct them with a credit note",
    "metering_creditnote": "credit notes are written once; issue another credit note",
    "metering_creditnoteline": "credit note lines are written once; issue another credit note",
}

CONTRACT_TERMS = (
    "id, organization_id, version, effective_from, revenue_share, prices, minimum_speedup, monthly_cap, "
    "currency, rounding, dispute_window_days, suite_version, suite_manifest_sha256, baseline, created_at, "
    "created_by"
)
INVOICE_IDENTITY = "id, organization_id, run_id, period, currency, total, created_at"
INVOICE_FINALIZATION = "number, finalized_at, finalized_by"
INVOICE_VOIDING = "voided_at, voided_by, void_reason"


def _row(prefix: str, columns: str) -> str:
    return "ROW(" + ", ".join(f"{prefix}.{c.strip()}" for c in columns.split(",")) + ")"


def _same(columns: str) -> str:
    return f"{_row('NEW', columns)} IS NOT DISTINCT FROM {_row('OLD', columns)}"


CREATE = f"""
CREATE EXTENSION IF NOT EXISTS btree_gist;

ALTER TABLE metering_contract ADD CONSTRAINT contract_versions_do_not_overlap
    EXCLUDE USING gist (organization_id WITH =, daterange(effective_from, effective_to, '[)') WITH &&);
ALTER TABLE metering_contract ADD CONSTRAINT contract_whole_months
    CHECK (EXTRACT(DAY FROM effective_from) = 1 AND (effective_to IS NULL OR EXTRACT(DAY FROM effective_to) = 1));
ALTER TABLE metering_contract ADD CONSTRAINT contract_prices_object CHECK (jsonb_typeof(prices) = 'object');
ALTER TABLE metering_billingrun ADD CONSTRAINT billing_run_whole_month CHECK (EXTRACT(DAY FROM period) = 1);
ALTER TABLE metering_billingrecord ADD CONSTRAINT billing_record_whole_month
    CHECK (EXTRACT(DAY FROM usage_period) = 1 AND span_start < span_end);
ALTER TABLE metering_invoice ADD CONSTRAINT invoice_whole_month CHECK (EXTRACT(DAY FROM period) = 1);
ALTER TABLE metering_invoiceline ADD CONSTRAINT invoice_line_whole_month CHECK (EXTRACT(DAY FROM usage_period) = 1);

ALTER TABLE metering_usageevent ADD CONSTRAINT usage_deployment_of_same_org
    FOREIGN KEY (deployment_id, organization_id) REFERENCES metering_deployment (id, organization_id);
-- Events arrive in time order, so block-range indexes stay small and cost little per insert.
CREATE INDEX usage_received_brin ON metering_usageevent USING brin (received_at);
CREATE INDEX usage_occurred_brin ON metering_usageevent USING brin (occurred_at);

CREATE OR REPLACE FUNCTION metering_refuse_change() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION '% refused on %: %', TG_OP, TG_TABLE_NAME, TG_ARGV[0]
        USING ERRCODE = 'integrity_constraint_violation';
END;
$$ LANGUAGE plpgsql;

CREATE OR REPLACE FUNCTION metering_contract_guard() RETURNS trigger AS $$
BEGIN
    IF OLD.effective_from > current_date AND (TG_OP = 'DELETE' OR NEW.effective_from > current_date) THEN
        -- Not in force yet: nothing was billed or agreed under it, so it may still change.
        IF TG_OP = 'DELETE' THEN RETURN OLD; END IF;
        RETURN NEW;
    END IF;
    IF TG_OP = 'UPDATE' AND OLD.effective_to IS NULL AND NEW.effective_to > current_date
       AND {_same(CONTRACT_TERMS)} THEN
        RETURN NEW;  -- closing the open end at a later month, for the next version
    END IF;
    RAISE EXCEPTION 'contract version % of organization % is in force since %: its terms never change (% refused); add a new version from a later month',
        OLD.version, OLD.organization_id, OLD.effective_from, TG_OP
        USING ERRCODE = 'integrity_constraint_violation';
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER metering_contract_in_force BEFORE UPDATE OR DELETE ON metering_contract
    FOR EACH ROW EXECUTE FUNCTION metering_contract_guard();

CREATE OR REPLACE FUNCTION metering_invoice_guard() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'invoices are never deleted (invoice %, %): void a finalized invoice or issue a credit note',
            COALESCE(OLD.number, OLD.id::text), OLD.status USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF OLD.status = 'draft' AND NEW.status = 'finalized' AND NEW.number IS NOT NULL
       AND {_same(INVOICE_IDENTITY)} AND {_same(INVOICE_VOIDING)} THEN
        RETURN NEW;
    END IF;
    IF OLD.status = 'finalized' AND NEW.status = 'void'
       AND {_same(INVOICE_IDENTITY)} AND {_same(INVOICE_FINALIZATION)} THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'invoice % is %: only draft -> finalized and finalized -> void may change it; correct it with a credit note',
        COALESCE(OLD.number, OLD.id::text), OLD.status USING ERRCODE = 'integrity_constraint_violation';
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER metering_invoice_transitions BEFORE UPDATE OR DELETE ON metering_invoice
    FOR EACH ROW EXECUTE FUNCTION metering_invoice_guard();

CREATE OR REPLACE FUNCTION metering_credit_guard() RETURNS trigger AS $$
DECLARE
    line_fee numeric;
    line_invoice uuid;
    note_invoice uuid;
    invoice_status text;
    credited numeric;
BEGIN
    SELECT l.fee, l.invoice_id, i.status INTO line_fee, line_invoice, invoice_status
        FROM metering_invoiceline l JOIN metering_invoice i ON i.id = l.invoice_id WHERE l.id = NEW.invoice_line_id;
    SELECT invoice_id INTO note_invoice FROM metering_creditnote WHERE id = NEW.credit_note_id;
    IF line_invoice IS DISTINCT FROM note_invoice THEN
        RAISE EXCEPTION 'credit note line % credits a line of another invoice', NEW.id
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF invoice_status <> 'finalized' THEN
        RAISE EXCEPTION 'only finalized invoices are credited; this one is %', invoice_status
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    SELECT COALESCE(SUM(amount), 0) INTO credited FROM metering_creditnoteline WHERE invoice_line_id = NEW.invoice_line_id;
    IF credited < LEAST(line_fee, 0) OR credited > GREATEST(line_fee, 0) THEN
        RAISE EXCEPTION 'credits of invoice line % would total %, beyond its fee %', NEW.invoice_line_id, credited, line_fee
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER metering_credit_within_line AFTER INSERT ON metering_creditnoteline
    FOR EACH ROW EXECUTE FUNCTION metering_credit_guard();
""" + "".join(
    f"""
CREATE TRIGGER {table}_written_once BEFORE UPDATE OR DELETE ON {table}
    FOR EACH ROW EXECUTE FUNCTION metering_refuse_change('{why}');
"""
    for table, why in WRITTEN_ONCE.items()
)

DROP = "".join(f"DROP TRIGGER IF EXISTS {table}_written_once ON {table};\n" for table in WRITTEN_ONCE) + """
DROP TRIGGER IF EXISTS metering_credit_within_line ON metering_creditnoteline;
DROP TRIGGER IF EXISTS metering_invoice_transitions ON metering_invoice;
DROP TRIGGER IF EXISTS metering_contract_in_force ON metering_contract;
DROP FUNCTION IF EXISTS metering_credit_guard();
DROP FUNCTION IF EXISTS metering_invoice_guard();
DROP FUNCTION IF EXISTS metering_contract_guard();
DROP FUNCTION IF EXISTS metering_refuse_change();
DROP INDEX IF EXISTS usage_occurred_brin;
DROP INDEX IF EXISTS usage_received_brin;
ALTER TABLE metering_usageevent DROP CONSTRAINT IF EXISTS usage_deployment_of_same_org;
ALTER TABLE metering_invoiceline DROP CONSTRAINT IF EXISTS invoice_line_whole_month;
ALTER TABLE metering_invoice DROP CONSTRAINT IF EXISTS invoice_whole_month;
ALTER TABLE metering_billingrecord DROP CONSTRAINT IF EXISTS billing_record_whole_month;
ALTER TABLE metering_billingrun DROP CONSTRAINT IF EXISTS billing_run_whole_month;
ALTER TABLE metering_contract DROP CONSTRAINT IF EXISTS contract_prices_object;
ALTER TABLE metering_contract DROP CONSTRAINT IF EXISTS contract_whole_months;
ALTER TABLE metering_contract DROP CONSTRAINT IF EXISTS contract_versions_do_not_overlap;
"""


def forwards(apps, schema_editor) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE, params=None)


def backwards(apps, schema_editor) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP, params=None)


class Migration(migrations.Migration):
    dependencies = [("metering", "0001_initial")]
    operations = [migrations.RunPython(forwards, backwards)]
