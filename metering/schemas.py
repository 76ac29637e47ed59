"""The typed shapes of the metering API (metering/api.py): what each endpoint reads and answers, as
pydantic models from which the OpenAPI document is generated. The dicts themselves are still written
by metering's serializers (serializers.py, contracts.contract_data, deployments.deployment_data,
usage.EventResult.as_dict, preview.InvoicePreview.as_dict); these models name every key they write.

Conventions as api/schemas.py: answers derive from `Out`; money, quantities, rates and speedups are
decimal strings (`Money`), never floats; a key written only sometimes is `Optional[...] = None`.

Request bodies derive from `In` (unknown keys refused). A field that the view or the service judges
itself, with its own error code and message (a period, a time, a contract term, the events of a
batch), is taken as sent (`_as_sent`) and documented as the type it should be; a field whose absence
they refuse themselves is optional in validation but required in the document (`_must_send`). So
the codes and messages stay those of metering's own checks, and who may ask (403) and what exists
(404) are still answered before what was sent.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, PlainValidator

from api.schemas import Day, Id, In, Moment, Money, Out, page_model
from metering.fees import CURRENCY_MINOR_UNITS, ROUNDING_MODES, FeeReason
from metering.models import CreditReason, InvoiceStatus, LineKind
from metering.usage import MAX_EVENTS, MAX_KEY_LENGTH, Rejection, Status

# A month, as periods.Period names it.
Period = Annotated[str, Field(pattern=r"^\d{4}-\d{2}$", examples=["2026-11"])]
Currency = Literal[tuple(CURRENCY_MINOR_UNITS)]  # type: ignore[valid-type]  # the currencies invoiced in
Rounding = Literal[tuple(ROUNDING_MODES)]  # type: ignore[valid-type]
LineKindName = Literal[tuple(LineKind.values)]  # type: ignore[valid-type]  # usage, adjustment, cap
FeeReasonName = Literal[tuple(reason.value for reason in FeeReason)]  # type: ignore[valid-type]
UnbilledReason = Literal["no_contract", "hardware_not_priced"]  # billing.Unbilled.reason
# A contract's terms as the contract rules took them from the client: a Decimal written by str(),
# plain, or in exponent form when it was sent so (1E+1). Stored columns read back plain; prices are
# kept as written.
Terms = Annotated[str, Field(pattern=r"^-?\d+(\.\d+)?(E[+-]\d+)?$", examples=["0.20"])]


def _must_send(*names: str) -> ConfigDict:
    """`names` are required in the document; the view (or service) refuses their absence itself,
    with its own code and message, so validation leaves them optional (their None default is not
    documented)."""

    def extra(schema: dict[str, Any]) -> None:
        required = schema.setdefault("required", [])
        required += [name for name in names if name not in required]
        for name in names:
            schema["properties"][name].pop("default", None)

    return ConfigDict(json_schema_extra=extra)


def _as_sent(documented: Any) -> PlainValidator:
    """A field taken as sent, unvalidated (the view judges it, with its own codes), and documented
    as `documented`."""
    return PlainValidator(lambda value: value, json_schema_input_type=documented)


# -- query parameters (plain strings, checked by the views: invalid_filter, invalid_period, invalid_format) --

# (No `examples` here: ninja copies a parameter's schema examples onto the parameter, where
# OpenAPI wants a map of Example objects.)
PERIOD_PARAMETER = {"pattern": r"^\d{4}-\d{2}$"}


def _absent_means_none(schema: dict[str, Any]) -> None:
    """A filter left out (or empty) filters nothing: its "" default is not a value to document."""
    for prop in schema["properties"].values():
        if prop.get("default") == "":
            del prop["default"]


class OrganizationQuery(BaseModel):
    model_config = ConfigDict(json_schema_extra=_absent_means_none)

    organization: str = Field("", description="an organization's slug; finance of the billing operator reads "
                                              "every organization, anyone else only its own")


class InvoiceQuery(BaseModel):
    model_config = ConfigDict(json_schema_extra=_absent_means_none)

    status: str = Field("", json_schema_extra={"enum": InvoiceStatus.values},
                        description="draft, finalized or void; absent: every status")
    period: str = Field("", json_schema_extra=PERIOD_PARAMETER,
                        description="the billed month, YYYY-MM (e.g. 2026-11); absent: every month")
    organization: str = Field("", description="an organization's slug")
    currency: str = Field("", description="ISO 4217, e.g. EUR")


class InvoiceExportQuery(BaseModel):
    format: str = Field("csv", json_schema_extra={"enum": ["csv", "xlsx", "pdf"]})


class RevenueShareQuery(BaseModel):
    model_config = _must_send("period")  # the view refuses its absence (invalid_period), after who may ask

    period: str = Field("", json_schema_extra=PERIOD_PARAMETER, description="the month, YYYY-MM (e.g. 2026-11)")
    format: str = Field("csv", json_schema_extra={"enum": ["csv", "xlsx"]})


# -- contracts ------------------------------------------------------------------------------------

class MeasurementPlan(Out):
    suite_version: str = Field(description="the audited suite the speedup is measured on, e.g. v1")
    suite_manifest_sha256: Optional[str] = Field(description="null: any manifest of the suite version")
    baseline: str = Field(description="the billed baseline as agreed")
    batch: Optional[int] = Field(description="the batch size the model is measured and billed at; null: any "
                                             "(the first stable report of an artifact decides)")
    seq: Optional[int] = Field(description="the sequence length the model is measured and billed at; null: any")


class Contract(Out):
    """One version of an organization's money terms, in force over whole months
    [effective_from, effective_to)."""

    id: Id
    organization: str = Field(description="the organization's slug")
    version: int
    effective_from: Day = Field(description="the first day of a month")
    effective_to: Optional[Day] = Field(description="exclusive, the first day of a month; null: open-ended")
    revenue_share: Terms = Field(description="a fraction between 0 and 1", examples=["0.200000"])
    prices: dict[str, Terms] = Field(description="hardware class -> price per GPU-hour",
                                     examples=[{"gpu-h100": "2.50"}])
    minimum_speedup: Terms = Field(examples=["1.050000"])
    monthly_cap: Optional[Terms] = Field(description="null: no cap")
    currency: Currency
    rounding: Rounding
    dispute_window_days: int
    measurement_plan: MeasurementPlan
    created_at: Optional[Moment]


class MeasurementPlanRequest(BaseModel):
    """The measurement plan as a contract request carries it (the contract rules judge it; other
    keys are ignored)."""

    suite_version: str = Field(examples=["v1"])
    suite_manifest_sha256: Optional[str] = Field(None, description="null or absent: any manifest of the suite "
                                                                    "version")
    baseline: str = Field(examples=["eager PyTorch with the standard ops"])
    batch: Optional[int] = Field(None, description="the batch size the model is measured and billed at (with seq); "
                                                   "absent: any shape", examples=[2])
    seq: Optional[int] = Field(None, description="the sequence length the model is measured and billed at (with "
                                                 "batch); absent: any shape", examples=[64])


class ContractRequest(In):
    """A new contract version. Every term is judged by the contract rules (contracts.py), which
    say which term is missing or wrong and what it takes (missing_field, invalid_field)."""

    model_config = _must_send("organization", "effective_from", "revenue_share", "prices", "minimum_speedup",
                              "measurement_plan")

    organization: Optional[str] = Field(None, description="the organization's slug")
    effective_from: Annotated[Any, _as_sent(Day)] = Field(None, description="the first day of a month")
    revenue_share: Annotated[Any, _as_sent(Money)] = Field(None, description="a fraction between 0 and 1 (0.20 "
                                                                             "for 20%)", examples=["0.20"])
    prices: Annotated[Any, _as_sent(dict[str, Money])] = Field(
        None, description="hardware class -> price per GPU-hour; at least one", examples=[{"gpu-h100": "2.50"}])
    minimum_speedup: Annotated[Any, _as_sent(Money)] = Field(None, description="1 or more: speedups below it "
                                                                               "bill nothing", examples=["1.05"])
    monthly_cap: Annotated[Any, _as_sent(Optional[Money])] = Field(None, description="in whole minor units; null "
                                                                                     "or absent: no cap")
    currency: Annotated[Any, _as_sent(Currency)] = Field(None, description="default EUR")
    rounding: Annotated[Any, _as_sent(Rounding)] = Field(None, description="default half_even")
    dispute_window_days: Annotated[Any, _as_sent(int)] = Field(None, description="0 to 365; default 30")
    measurement_plan: Annotated[Any, _as_sent(MeasurementPlanRequest)] = None


ContractPage = page_model("ContractPage", "contracts", Contract)


# -- deployments ----------------------------------------------------------------------------------

class DeploymentReport(Out):
    """From `effective_from` on, the deployment bills under `report`."""

    report: Id
    report_sha256: str
    ci_low: Money = Field(description="the report's model-level CI lower bound: the speedup billed")
    stable: bool
    effective_from: Moment


class Deployment(Out):
    id: Id
    name: str
    organization: str = Field(description="the organization's slug")
    model_version: Id
    hardware: str
    artifact_sha256: Optional[str]
    active_from: Moment = Field(description="usage before this moment is refused")
    reports: list[DeploymentReport] = Field(description="the history of the report it bills under, oldest first")


class DeploymentRequest(In):
    model_config = _must_send("report", "name")

    report: Annotated[Any, _as_sent(Id)] = Field(None, description="a stable signed report of your organization: "
                                                                   "the artifact it measured is what is deployed")
    name: Optional[str] = Field(None, description="1 to 100 characters, unique in your organization",
                                examples=["prod-eu"])
    active_from: Annotated[Any, _as_sent(Moment)] = Field(None, description="RFC 3339 with a timezone; absent: now")


class DeploymentReportRequest(In):
    model_config = _must_send("report", "reason")

    report: Annotated[Any, _as_sent(Id)] = Field(None, description="a report of the same artifact, stable, on the "
                                                                   "contract's plan")
    reason: Optional[str] = Field(None, description="why, for the audit log")
    effective_from: Annotated[Any, _as_sent(Moment)] = Field(None, description="RFC 3339 with a timezone; absent: "
                                                                               "the report's own date")


DeploymentPage = page_model("DeploymentPage", "deployments", Deployment)


# -- usage ----------------------------------------------------------------------------------------

class UsageEvent(BaseModel):
    """One usage event, as the batch carries it (each is judged on its own: a bad one is `rejected`
    with a reason, the others are still counted; keys besides these are ignored)."""

    idempotency_key: str = Field(min_length=1, max_length=MAX_KEY_LENGTH,
                                 description="unique per event you mean to count once")
    deployment: Id
    timestamp: Moment = Field(description="at most 35 days back, 5 minutes ahead")
    gpu_hours: Money = Field(description="positive, at most 6 decimal places", examples=["1.25"])


class UsageBatch(In):
    model_config = _must_send("events")

    # Read loosely: a missing, empty or non-list `events` is the view's invalid_batch, a long one its
    # batch_too_large; each event is judged by usage_ingest, per event.
    events: Annotated[Any, _as_sent(Annotated[list[UsageEvent], Field(min_length=1, max_length=MAX_EVENTS)])] = None


class UsageRejection(Out):
    code: Literal[tuple(r.value for r in Rejection)]  # type: ignore[valid-type]
    message: str


class UsageEventResult(Out):
    idempotency_key: Optional[str] = Field(description="as sent; null when it was not a string")
    status: Literal[tuple(s.value for s in Status)]  # type: ignore[valid-type]
    reason: Optional[UsageRejection] = Field(None, description="on a rejected event only")


class UsageBatchResult(Out):
    created: int
    duplicate: int
    rejected: int
    results: list[UsageEventResult] = Field(description="one per event, in order")


# -- billing runs ---------------------------------------------------------------------------------

class Unbilled(Out):
    """Usage no contract prices: listed, not invoiced."""

    deployment: Id
    usage_period: Period
    hours: Money
    reason: UnbilledReason


class BillingRunSummary(Out):
    period: Period
    cutoff: Moment
    invoices: int
    records: int
    events: int
    hours: Money
    totals: dict[str, Money] = Field(description="currency -> the invoices' total")
    unbilled_count: int
    unbilled: list[Unbilled] = Field(description="the first 100")
    reissued: Optional[list[Id]] = Field(None, description="void invoices whose usage this run billed again (absent "
                                                           "on runs made before voiding released usage)")


class BillingRunLinks(Out):
    page: str


class BillingRun(Out):
    id: Id
    period: Period
    cutoff: Moment = Field(description="usage received before this moment is billed")
    created_at: Moment
    created_by: str
    summary: BillingRunSummary
    links: BillingRunLinks


class BillingRunCreated(BillingRun):
    created: bool = Field(description="false: the period was billed already, and this is that run")


class BillingRunRequest(In):
    model_config = _must_send("period")

    # Read loosely: anything but a month (absent, not a string, not YYYY-MM) is the view's invalid_period.
    period: Annotated[Any, _as_sent(Period)] = Field(None, description="the month to bill, YYYY-MM")


BillingRunPage = page_model("BillingRunPage", "billing_runs", BillingRun)


# -- invoices and credit notes --------------------------------------------------------------------

class BillingRecord(Out):
    """The signed report (digest, key, signature) a line rests on and the exact figures it rounds."""

    id: int
    deployment: Id
    hardware: str
    report: Id
    report_sha256: str
    report_key_id: str
    report_signature: str
    ci_low: Money
    stable: bool
    events: int
    span: list[Moment] = Field(min_length=2, max_length=2, description="the first and last event's time")
    savings_exact: Money
    fee_exact: Money
    contract: Id
    rounding: Rounding


class InvoiceLine(Out):
    id: int
    position: int
    kind: LineKindName
    usage_period: Period
    description: str
    hours: Money
    speedup: Money = Field(description="S billed: the report's CI lower bound, or 1 with a reason")
    saved_hours: Money
    price_per_hour: Money
    share: Money
    savings: Money
    fee: Money
    reason: Optional[FeeReasonName]
    credited: Money = Field(description="credited on this line by credit notes so far")
    billing_record: Optional[BillingRecord] = Field(None, description="on usage and adjustment lines, not on a "
                                                                      "cap line")


class CreditNoteLine(Out):
    invoice_line: int
    amount: Money = Field(description="negative for the cap line a full credit note reverses")


class CreditNote(Out):
    id: Id
    number: str
    invoice: Id
    reason_code: Literal[tuple(CreditReason.values)]  # type: ignore[valid-type]
    memo: str
    full: bool
    currency: Currency
    total: Money
    created_at: Moment
    lines: list[CreditNoteLine]


class InvoiceLinks(Out):
    self: str
    page: str


class Invoice(Out):
    id: Id
    number: Optional[str] = Field(description="INV-<year>-<n> once finalized; null on a draft")
    organization: str = Field(description="the organization's slug")
    period: Period
    currency: Currency
    status: Literal[tuple(InvoiceStatus.values)]  # type: ignore[valid-type]
    total: Money
    balance: Money = Field(description="what remains owed: the total less credits (0 when void)")
    billing_run: Id
    created_at: Moment
    finalized_at: Optional[Moment]
    voided_at: Optional[Moment]
    void_reason: Optional[str]
    links: InvoiceLinks
    lines: Optional[list[InvoiceLine]] = Field(None, description="on an invoice's own answer only")
    credit_notes: Optional[list[CreditNote]] = Field(None, description="on an invoice's own answer only, oldest "
                                                                       "first")


class VoidRequest(In):
    model_config = _must_send("reason")

    reason: Optional[str] = Field(None, description="why the invoice is void; kept for audit")


class ReissueRequest(In):
    reason: Optional[str] = Field(None, description="required to void a finalized invoice; not needed to bill a "
                                                    "void invoice's usage again")


class CreditNoteRequest(In):
    """`full: true`, or `lines`: invoice line id -> amount in whole minor units."""

    model_config = _must_send("reason_code")

    reason_code: Annotated[Any, _as_sent(Literal[tuple(CreditReason.values)])] = None  # type: ignore[valid-type]
    memo: Optional[str] = None
    full: Annotated[Any, _as_sent(bool)] = Field(None, description="credit every line's remaining amount (the cap "
                                                                   "line reversed too)")
    lines: Annotated[Any, _as_sent(dict[str, Money])] = Field(None, description="invoice line id -> amount, when "
                                                                                "not full",
                                                              examples=[{"123": "2.50"}])


InvoicePage = page_model("InvoicePage", "invoices", Invoice)
CreditNotePage = page_model("CreditNotePage", "credit_notes", CreditNote)


# -- the upcoming invoice -------------------------------------------------------------------------

class PreviewLine(Out):
    """One line as the invoice would show it. A cap line has no deployment or report."""

    position: int
    kind: LineKindName
    usage_period: Period
    description: str
    deployment: Optional[Id]
    deployment_name: Optional[str]
    hardware: Optional[str]
    report: Optional[Id]
    report_sha256: Optional[str]
    ci_low: Optional[Money]
    speedup: Money = Field(description="S billed: the report's CI lower bound, or 1 with a reason")
    hours: Money
    saved_hours: Money
    price_per_hour: Money
    share: Money
    savings: Money
    fee: Money
    reason: Optional[FeeReasonName]


class PreviewInvoice(Out):
    organization: str = Field(description="the organization's slug")
    currency: Currency
    monthly_cap: Optional[Money] = Field(description="the cap of the contract in force in the period; null: none")
    cap_applied: Money = Field(description="the cap lines' sum, zero or negative")
    total: Money
    lines: list[PreviewLine]


class InvoicePreview(Out):
    period: Period
    as_of: Moment = Field(description="usage received before this moment is counted")
    previous_run: Optional[Period] = Field(description="the billed month whose run this one follows; null while the "
                                                       "previous month is unbilled (its run takes all earlier usage)")
    invoices: list[PreviewInvoice]
    unbilled: list[Unbilled]
