"""What is written is written: finalized invoices, their lines and billing records, contract
versions in force, credit notes. Refused through the ORM, through raw SQL and through the admin."""

from __future__ import annotations

from datetime import date, timedelta
from decimal import Decimal

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.utils import DatabaseError
from django.utils import timezone

pytestmark = pytest.mark.django_db


def _refused(statement: str, params: list | None = None, match: str | None = None) -> None:
    with pytest.raises(DatabaseError, match=match), transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(statement, params or [])


@pytest.fixture
def finalized(billed):
    from metering.invoices import invoice_finalize

    return invoice_finalize(invoice=billed["acme"], actor="system:test")


def test_it_refuses_orm_changes_to_a_finalized_invoice_its_lines_and_records(finalized):
    from metering.models import BillingRecord, Invoice, InvoiceLine

    line = finalized.lines.first()
    with pytest.raises(IntegrityError, match="correct it with a credit note"), transaction.atomic():
        Invoice.objects.filter(pk=finalized.pk).update(total=Decimal("1.00"))
    with pytest.raises(IntegrityError), transaction.atomic():  # PROTECT in Python, the trigger below it
        Invoice.objects.filter(pk=finalized.pk).delete()
    with pytest.raises(IntegrityError, match="written once"), transaction.atomic():
        line.fee = Decimal("0.01")
        line.save()
    with pytest.raises(IntegrityError, match="written once"), transaction.atomic():
        BillingRecord.objects.filter(pk=line.record_id).update(hours=Decimal("1"))
    with pytest.raises(IntegrityError), transaction.atomic():
        InvoiceLine.objects.filter(pk=line.pk).delete()
    finalized.refresh_from_db()
    assert finalized.total == Decimal("32.50") and finalized.lines.count() == 2


def test_it_refuses_raw_sql_changes_except_voiding(finalized):
    line = finalized.lines.first()
    _refused("UPDATE metering_invoice SET total = 0 WHERE id = %s", [finalized.pk], "credit note")
    _refused("UPDATE metering_invoice SET status = 'draft', number = NULL, finalized_at = NULL WHERE id = %s",
             [finalized.pk])
    _refused("UPDATE metering_invoice SET status = 'void', voided_at = now(), total = 0 WHERE id = %s",
             [finalized.pk])
    _refused("DELETE FROM metering_invoice WHERE id = %s", [finalized.pk])
    _refused("UPDATE metering_invoiceline SET fee = 0 WHERE id = %s", [line.pk], "written once")
    _refused("DELETE FROM metering_billingrecord WHERE id = %s", [line.record_id], "written once")
    _refused("UPDATE metering_billingrun SET cutoff = now() WHERE id = %s", [finalized.run_id], "written once")
    with connection.cursor() as cursor:  # the one change left: finalized -> void
        cursor.execute("UPDATE metering_invoice SET status = 'void', voided_at = now(), void_reason = 'sql' "
                       "WHERE id = %s", [finalized.pk])
    _refused("UPDATE metering_invoice SET status = 'finalized', voided_at = NULL WHERE id = %s", [finalized.pk])


def test_it_refuses_changes_to_a_draft_other_than_finalizing(billed):
    draft = billed["acme"]
    _refused("UPDATE metering_invoice SET total = 99 WHERE id = %s", [draft.pk])
    _refused("UPDATE metering_invoice SET status = 'finalized', number = 'X-1', finalized_at = now(), total = 1 "
             "WHERE id = %s", [draft.pk])
    _refused("UPDATE metering_invoice SET status = 'void', voided_at = now() WHERE id = %s", [draft.pk])


def test_it_refuses_credits_beyond_a_line_in_the_database(finalized):
    from metering.invoices import credit_note_issue

    line = finalized.lines.get(position=2)
    note = credit_note_issue(invoice=finalized, actor="system:test", reason_code="goodwill", amounts={line.pk: "1.00"})
    _refused("INSERT INTO metering_creditnoteline (credit_note_id, invoice_line_id, amount) VALUES (%s, %s, 19.01)",
             [note.pk, finalized.lines.get(position=1).pk], "beyond its fee")
    _refused("UPDATE metering_creditnoteline SET amount = 2 WHERE credit_note_id = %s", [note.pk], "written once")
    _refused("UPDATE metering_creditnote SET total = 2 WHERE id = %s", [note.pk], "written once")


def test_it_keeps_the_terms_of_a_contract_in_force(make_org, make_contract, billing_settings):
    from metering.contracts import contract_terms_from, contract_version_create
    from metering.errors import BillingError
    from metering.models import Contract
    from tests.metering.conftest import TERMS

    org = make_org("acme")
    contract = make_contract(org, effective_from=date(2025, 1, 1))
    with pytest.raises(IntegrityError, match="its terms never change"), transaction.atomic():
        Contract.objects.filter(pk=contract.pk).update(revenue_share=Decimal("0.5"))
    _refused("DELETE FROM metering_contract WHERE id = %s", [contract.pk], "its terms never change")
    # Closing the open end is allowed only with every term as it was, the billed shape included.
    _refused("UPDATE metering_contract SET effective_to = '2099-01-01', measured_batch = 8, measured_seq = 512 "
             "WHERE id = %s", [contract.pk], "its terms never change")
    _refused("UPDATE metering_contract SET effective_to = '2025-02-01' WHERE id = %s", [contract.pk],
             "its terms never change")  # closing it in the past would rewrite history
    with pytest.raises(IntegrityError), transaction.atomic():  # versions never overlap
        Contract.objects.create(organization=org, version=9, effective_from=date(2025, 6, 1),
                                revenue_share=Decimal("0.1"), prices={"gpu-h100": "1"},
                                minimum_speedup=Decimal("1"), suite_version="v1", baseline="b")
    with pytest.raises(BillingError, match="has begun"):
        contract_version_create(organization=org, terms=contract_terms_from(TERMS), actor="system:test",
                                effective_from=date.today().replace(day=1))
    later = (timezone.now().date().replace(day=1) + timedelta(days=32)).replace(day=1)
    successor = contract_version_create(organization=org, terms=contract_terms_from({**TERMS, "revenue_share": "0.25"}),
                                        effective_from=later, actor="system:test")
    contract.refresh_from_db()
    assert contract.effective_to == later and successor.version == 2 and successor.revenue_share == Decimal("0.25")
    # Not yet in force: still changeable (nothing was agreed or billed under it).
    Contract.objects.filter(pk=successor.pk).update(revenue_share=Decimal("0.3"))


def test_it_shows_billing_read_only_in_the_admin(finalized, django_user_model, client):
    admin = django_user_model.objects.create_superuser("root@dyno.test", "root@dyno.test", "a-long-password-1")
    client.force_login(admin)
    page = client.get(f"/admin/metering/invoice/{finalized.pk}/change/")
    assert page.status_code == 200 and b'name="_save"' not in page.content
    posted = client.post(f"/admin/metering/invoice/{finalized.pk}/change/", {"status": "draft", "total": "0"})
    assert posted.status_code == 403
    assert client.post(f"/admin/metering/invoice/{finalized.pk}/delete/", {"post": "yes"}).status_code == 403
    record = finalized.lines.first().record
    assert client.post(f"/admin/metering/billingrecord/{record.pk}/change/", {"fee": "0"}).status_code == 403
    assert client.get("/admin/metering/invoice/add/").status_code == 403
    finalized.refresh_from_db()
    assert finalized.status == "finalized" and finalized.total == Decimal("32.50")
