"""Tables of the metering app: contracts, deployments and their report history, usage events,
billing runs and records, invoices with their lines, credit notes, reissues and the document counters.

What must never change is refused by PostgreSQL itself (migrations 0002 and 0003): usage events
and report history are append-only, billing records, invoice lines, credit notes and reissues are
written once, a contract version in force keeps its terms, and an invoice only ever moves draft ->
finalized -> void. Money is Decimal: quantities to 6 places, rounded money to 3 (the widest minor
unit we invoice in), exact intermediate amounts to 24 (the product of four 6-place factors).
"""

from __future__ import annotations

import uuid

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from accounts.models import Organization
from catalog.models import ModelVersion
from metering.fees import CURRENCY_MINOR_UNITS, DEFAULT_CURRENCY, DEFAULT_ROUNDING, ROUNDING_MODES
from reports.models import Report

QUANTITY = {"max_digits": 20, "decimal_places": 6}  # GPU-hours
RATE = {"max_digits": 20, "decimal_places": 6}  # price per GPU-hour
FRACTION = {"max_digits": 7, "decimal_places": 6}  # revenue share, 0..1
SPEEDUP = {"max_digits": 12, "decimal_places": 6}  # as reports.Report stores it
MONEY = {"max_digits": 20, "decimal_places": 3}  # rounded to the currency's minor unit
EXACT = {"max_digits": 48, "decimal_places": 24}  # unrounded products, kept for audit


class Contract(models.Model):
    """One version of an organization's money terms, in force over whole months
    [effective_from, effective_to). A change is a new version; the terms of a version in force
    never change (its open end may be closed once, for a later month)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey(Organization, on_delete=models.PROTECT, related_name="contracts")
    version = models.PositiveIntegerField()
    effective_from = models.DateField()  # the first day of a month
    effective_to = models.DateField(null=True, blank=True)  # exclusive; the first day of a month
    revenue_share = models.DecimalField(**FRACTION)
    # hardware class -> decimal string price per GPU-hour, e.g. {"gpu-h100": "2.50"}
    prices = models.JSONField()
    minimum_speedup = models.DecimalField(**SPEEDUP)
    monthly_cap = models.DecimalField(**MONEY, null=True, blank=True)
    currency = models.CharField(max_length=3, default=DEFAULT_CURRENCY)
    rounding = models.CharField(max_length=16, default=DEFAULT_ROUNDING)
    dispute_window_days = models.PositiveSmallIntegerField(default=30)
    # The measurement plan, agreed before the work (IPMVP): which suite, which baseline.
    suite_version = models.CharField(max_length=32)
    suite_manifest_sha256 = models.CharField(max_length=64, blank=True)  # blank: any manifest of the version
    baseline = models.TextField()
    # The shape the model is measured and billed at (batch x sequence), agreed like the suite: the
    # customer's first run no longer decides it (red team 18: the first report in force was at
    # whatever shape the customer ran first, the one where the gain is least). Null on both: any.
    measured_batch = models.PositiveIntegerField(null=True, blank=True)
    measured_seq = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.CharField(max_length=254, blank=True)

    class Meta:
        ordering = ["organization_id", "effective_from"]
        constraints = [
            models.UniqueConstraint(fields=["organization", "version"], name="contract_version_unique"),
            models.UniqueConstraint(fields=["organization", "effective_from"], name="contract_start_unique"),
            models.CheckConstraint(condition=Q(effective_to__isnull=True) | Q(effective_to__gt=models.F("effective_from")),
                                   name="contract_dates_ordered"),
            models.CheckConstraint(condition=Q(revenue_share__gte=0) & Q(revenue_share__lte=1),
                                   name="contract_share_fraction"),
            models.CheckConstraint(condition=Q(minimum_speedup__gte=1), name="contract_minimum_at_least_1"),
            models.CheckConstraint(condition=Q(monthly_cap__isnull=True) | Q(monthly_cap__gte=0),
                                   name="contract_cap_not_negative"),
            models.CheckConstraint(condition=Q(rounding__in=list(ROUNDING_MODES)), name="contract_rounding_known"),
            models.CheckConstraint(condition=Q(currency__in=list(CURRENCY_MINOR_UNITS)),
                                   name="contract_currency_known"),
            models.CheckConstraint(condition=~Q(suite_version=""), name="contract_plan_has_suite"),
            models.CheckConstraint(condition=Q(measured_batch__isnull=True, measured_seq__isnull=True)
                                   | Q(measured_batch__gte=1, measured_seq__gte=1),
                                   name="contract_plan_shape_whole"),
        ]

    def __str__(self) -> str:
        return f"{self.organization_id} contract v{self.version} from {self.effective_from}"


class Deployment(models.Model):
    """A model version's optimization artifact serving on a hardware class, billed under the
    signed report in force at each moment (see DeploymentReport)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey(Organization, on_delete=models.PROTECT, related_name="deployments")
    name = models.CharField(max_length=100)
    model_version = models.ForeignKey(ModelVersion, on_delete=models.PROTECT, related_name="deployments")
    hardware = models.CharField(max_length=32)
    artifact_sha256 = models.CharField(max_length=64, blank=True)
    active_from = models.DateTimeField()  # usage before this moment is refused
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.CharField(max_length=254, blank=True)

    class Meta:
        ordering = ["organization_id", "name"]
        constraints = [
            models.UniqueConstraint(fields=["organization", "name"], name="deployment_name_unique_in_org"),
            # The target of usage events' composite foreign key (deployment, organization).
            models.UniqueConstraint(fields=["id", "organization"], name="deployment_id_org_unique"),
        ]

    def __str__(self) -> str:
        return self.name


class DeploymentReport(models.Model):
    """From `effective_from` on, the deployment bills under `report` (append-only history)."""

    deployment = models.ForeignKey(Deployment, on_delete=models.PROTECT, related_name="report_history")
    report = models.ForeignKey(Report, on_delete=models.PROTECT, related_name="deployment_history")
    effective_from = models.DateTimeField()
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.CharField(max_length=254, blank=True)

    class Meta:
        ordering = ["deployment_id", "effective_from"]
        constraints = [
            models.UniqueConstraint(fields=["deployment", "effective_from"], name="deployment_switch_unique_time"),
            models.UniqueConstraint(fields=["deployment", "report"], name="deployment_report_once"),
        ]


class UsageEvent(models.Model):
    """GPU-hours served by a deployment, as the customer reported them. Append-only; the
    idempotency key is unique per organization; `received_at` is the database's clock."""

    id = models.BigAutoField(primary_key=True)
    # Both foreign keys are checked by one composite key (deployment, organization) in SQL.
    organization = models.ForeignKey(Organization, on_delete=models.PROTECT, related_name="+",
                                     db_constraint=False, db_index=False)
    deployment = models.ForeignKey(Deployment, on_delete=models.PROTECT, related_name="usage_events",
                                   db_constraint=False, db_index=False)
    idempotency_key = models.CharField(max_length=200)
    occurred_at = models.DateTimeField()
    gpu_hours = models.DecimalField(**QUANTITY)
    payload_sha256 = models.CharField(max_length=64)
    received_at = models.DateTimeField(db_default=Now())  # the database's clock, at insert

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["organization", "idempotency_key"], name="usage_idempotency_key_unique"),
            models.CheckConstraint(condition=Q(gpu_hours__gt=0), name="usage_hours_positive"),
        ]
        # No other b-tree: every index costs each insert, and billing scans by time (BRIN, 0002).


class BillingRun(models.Model):
    """The billing of one period. It claims every usage event that no earlier run claimed and
    that happened before the period's end and was received before `cutoff` (billing.py)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    period = models.DateField(unique=True)  # the first day of the month
    cutoff = models.DateTimeField()
    previous = models.OneToOneField("self", null=True, blank=True, on_delete=models.PROTECT, related_name="next_run")
    summary = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.CharField(max_length=254, blank=True)

    class Meta:
        ordering = ["-period"]

    def __str__(self) -> str:
        return f"billing run {self.period:%Y-%m}"


class RecordKind(models.TextChoices):
    USAGE = "usage"  # usage of the run's own period
    ADJUSTMENT = "adjustment"  # usage of an earlier period that arrived after that period's run


class BillingRecord(models.Model):
    """One deployment's usage under one report in one usage month, as one run billed it, with
    the exact figures and the signed report it rests on. Written once."""

    id = models.BigAutoField(primary_key=True)
    run = models.ForeignKey(BillingRun, on_delete=models.PROTECT, related_name="records")
    organization = models.ForeignKey(Organization, on_delete=models.PROTECT, related_name="+")
    contract = models.ForeignKey(Contract, on_delete=models.PROTECT, related_name="records")
    deployment = models.ForeignKey(Deployment, on_delete=models.PROTECT, related_name="records")
    report = models.ForeignKey(Report, on_delete=models.PROTECT, related_name="billing_records")
    report_sha256 = models.CharField(max_length=64)
    report_key_id = models.CharField(max_length=64)
    report_signature = models.CharField(max_length=128)
    kind = models.CharField(max_length=16, choices=RecordKind.choices)
    usage_period = models.DateField()
    span_start = models.DateTimeField()
    span_end = models.DateTimeField()
    hardware = models.CharField(max_length=32)
    events = models.PositiveIntegerField()
    hours = models.DecimalField(**QUANTITY)
    ci_low = models.DecimalField(**SPEEDUP)
    stable = models.BooleanField()
    speedup = models.DecimalField(**SPEEDUP)  # billable: ci_low, or 1 with a reason
    saved_hours = models.DecimalField(**EXACT)
    price_per_hour = models.DecimalField(**RATE)
    share = models.DecimalField(**FRACTION)
    savings_exact = models.DecimalField(**EXACT)
    fee_exact = models.DecimalField(**EXACT)
    savings = models.DecimalField(**MONEY)
    fee = models.DecimalField(**MONEY)
    currency = models.CharField(max_length=3)
    rounding = models.CharField(max_length=16)
    reason = models.CharField(max_length=32, blank=True)
    # Set on the records of a corrective invoice (invoice_reissue); None for a run's own records.
    reissue = models.ForeignKey("Reissue", null=True, blank=True, on_delete=models.PROTECT, related_name="records")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run_id", "usage_period", "deployment_id", "span_start"]
        constraints = [
            # A run bills each segment once; a corrective invoice made in the same run (a reissue)
            # bills it once more, under its Reissue row.
            models.UniqueConstraint(fields=["run", "deployment", "report", "usage_period"],
                                    condition=Q(reissue__isnull=True), name="billing_record_once_per_run"),
            models.UniqueConstraint(fields=["reissue", "deployment", "report", "usage_period"],
                                    condition=Q(reissue__isnull=False), name="billing_record_once_per_reissue"),
            models.CheckConstraint(condition=Q(hours__gte=0) & Q(fee__gte=0) & Q(savings__gte=0),
                                   name="billing_record_not_negative"),
            models.CheckConstraint(condition=Q(kind__in=RecordKind.values), name="billing_record_kind_known"),
        ]


class InvoiceStatus(models.TextChoices):
    DRAFT = "draft"
    FINALIZED = "finalized"
    VOID = "void"


# The whole state machine: which status may follow which (the trigger in 0002 agrees).
INVOICE_TRANSITIONS: dict[str, tuple[str, ...]] = {
    InvoiceStatus.DRAFT: (InvoiceStatus.FINALIZED,),
    InvoiceStatus.FINALIZED: (InvoiceStatus.VOID,),
    InvoiceStatus.VOID: (),
}


class Invoice(models.Model):
    """One organization's bill from one run, in one currency. Its lines are fixed at creation;
    finalizing gives it the next gapless number of its year; voiding keeps the number and lines
    and releases its usage, which is billed again once (see Reissue)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey(Organization, on_delete=models.PROTECT, related_name="invoices")
    run = models.ForeignKey(BillingRun, on_delete=models.PROTECT, related_name="invoices")
    period = models.DateField()
    currency = models.CharField(max_length=3)
    status = models.CharField(max_length=16, choices=InvoiceStatus.choices, default=InvoiceStatus.DRAFT)
    number = models.CharField(max_length=32, null=True, blank=True, unique=True)
    total = models.DecimalField(**MONEY)
    created_at = models.DateTimeField(auto_now_add=True)
    finalized_at = models.DateTimeField(null=True, blank=True)
    finalized_by = models.CharField(max_length=254, blank=True)
    voided_at = models.DateTimeField(null=True, blank=True)
    voided_by = models.CharField(max_length=254, blank=True)
    void_reason = models.TextField(blank=True)

    class Meta:
        ordering = ["-period", "organization_id"]
        # Staff with this permission bill every customer organization (selectors.billing_access).
        permissions = [("bill_customers", "Can run billing and finalize invoices for every organization")]
        constraints = [
            # A void invoice and the corrective invoice that bills its usage again share a run.
            models.UniqueConstraint(fields=["run", "organization", "currency"],
                                    condition=~Q(status=InvoiceStatus.VOID), name="invoice_once_per_run"),
            models.CheckConstraint(condition=Q(status__in=InvoiceStatus.values), name="invoice_status_known"),
            models.CheckConstraint(
                condition=(Q(status=InvoiceStatus.DRAFT, number__isnull=True, finalized_at__isnull=True)
                           | (~Q(status=InvoiceStatus.DRAFT) & Q(number__isnull=False, finalized_at__isnull=False))),
                name="invoice_number_iff_finalized"),
            models.CheckConstraint(
                condition=Q(status=InvoiceStatus.VOID, voided_at__isnull=False)
                | (~Q(status=InvoiceStatus.VOID) & Q(voided_at__isnull=True)),
                name="invoice_void_has_time"),
            models.CheckConstraint(condition=Q(total__gte=0), name="invoice_total_not_negative"),
        ]

    def __str__(self) -> str:
        return self.number or f"draft {str(self.id)[:8]}"


class LineKind(models.TextChoices):
    USAGE = "usage"
    ADJUSTMENT = "adjustment"
    CAP = "cap"


class InvoiceLine(models.Model):
    """One line as shown and summed. Usage and adjustment lines carry their billing record;
    a cap line carries the (negative) amount that brings its month's fees down to the cap."""

    id = models.BigAutoField(primary_key=True)
    invoice = models.ForeignKey(Invoice, on_delete=models.PROTECT, related_name="lines")
    position = models.PositiveIntegerField()
    kind = models.CharField(max_length=16, choices=LineKind.choices)
    record = models.OneToOneField(BillingRecord, null=True, blank=True, on_delete=models.PROTECT,
                                  related_name="line")
    usage_period = models.DateField()
    description = models.CharField(max_length=300)
    hours = models.DecimalField(**QUANTITY)
    speedup = models.DecimalField(**SPEEDUP)
    saved_hours = models.DecimalField(**EXACT)
    price_per_hour = models.DecimalField(**RATE)
    share = models.DecimalField(**FRACTION)
    savings = models.DecimalField(**MONEY)
    fee = models.DecimalField(**MONEY)
    reason = models.CharField(max_length=32, blank=True)

    class Meta:
        ordering = ["invoice_id", "position"]
        constraints = [
            models.UniqueConstraint(fields=["invoice", "position"], name="invoice_line_position_unique"),
            models.CheckConstraint(condition=Q(kind__in=LineKind.values), name="invoice_line_kind_known"),
            models.CheckConstraint(
                condition=(Q(kind=LineKind.CAP, record__isnull=True, fee__lte=0)
                           | (~Q(kind=LineKind.CAP) & Q(record__isnull=False, fee__gte=0))),
                name="invoice_line_record_unless_cap"),
        ]


class CreditReason(models.TextChoices):
    BILLING_ERROR = "billing_error", "billing error"
    REPORT_DISPUTE = "report_dispute", "report disputed or re-audited"
    SERVICE_CREDIT = "service_credit", "service credit"
    DUPLICATE = "duplicate", "duplicate charge"
    GOODWILL = "goodwill", "goodwill"


class CreditNote(models.Model):
    """A correction of a finalized invoice: credits against some or all of its lines. Numbered
    in its own gapless series at issue, written once."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    invoice = models.ForeignKey(Invoice, on_delete=models.PROTECT, related_name="credit_notes")
    organization = models.ForeignKey(Organization, on_delete=models.PROTECT, related_name="credit_notes")
    number = models.CharField(max_length=32, unique=True)
    reason_code = models.CharField(max_length=32, choices=CreditReason.choices)
    memo = models.TextField(blank=True)
    full = models.BooleanField(default=False)
    currency = models.CharField(max_length=3)
    total = models.DecimalField(**MONEY)
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.CharField(max_length=254, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(condition=Q(total__gt=0), name="credit_note_total_positive"),
            models.CheckConstraint(condition=Q(reason_code__in=CreditReason.values), name="credit_note_reason_known"),
        ]

    def __str__(self) -> str:
        return self.number


class CreditNoteLine(models.Model):
    credit_note = models.ForeignKey(CreditNote, on_delete=models.PROTECT, related_name="lines")
    invoice_line = models.ForeignKey(InvoiceLine, on_delete=models.PROTECT, related_name="credits")
    # Positive for usage lines; a full credit note also reverses the cap line (negative).
    amount = models.DecimalField(**MONEY)

    class Meta:
        ordering = ["credit_note_id", "invoice_line_id"]
        constraints = [
            models.UniqueConstraint(fields=["credit_note", "invoice_line"], name="credit_line_once_per_note"),
            models.CheckConstraint(condition=~Q(amount=0), name="credit_line_not_zero"),
        ]


class Reissue(models.Model):
    """A void invoice's usage, billed again once: on `invoice`, either the invoice of a later
    billing run (the run picks released usage up) or a corrective invoice of the same run made at
    once (invoices.invoice_reissue). A void invoice without one has its usage released, waiting."""

    id = models.BigAutoField(primary_key=True)
    voided = models.OneToOneField(Invoice, on_delete=models.PROTECT, related_name="reissue")
    invoice = models.ForeignKey(Invoice, on_delete=models.PROTECT, related_name="reissues")
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.CharField(max_length=254, blank=True)

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [
            models.CheckConstraint(condition=~Q(voided=models.F("invoice")), name="reissue_on_another_invoice"),
        ]

    def __str__(self) -> str:
        return f"{self.voided_id} billed again on {self.invoice_id}"


class DocumentCounter(models.Model):
    """The last number given in a series ("INV", "CN") and year; locked FOR UPDATE to number."""

    series = models.CharField(max_length=8)
    year = models.PositiveIntegerField()
    last = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["series", "year"], name="document_counter_unique")]

    def __str__(self) -> str:
        return f"{self.series}-{self.year}: {self.last}"
