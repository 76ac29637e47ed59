"""Billing runs: usage aggregated in SQL per deployment, report segment and usage month, priced by
the money rules (fees.py), stored as billing records and draft invoices in one transaction.

Which events a run bills (its claim), with runs made in period order: an event belongs to the
first run whose period ends after the event happened and whose cutoff is after it was received.
So run k claims `occurred_at < end_k AND received_at < cutoff_k` minus what run k-1 claimed. Late
usage of a billed month falls to the next run and becomes an adjustment line there. The cutoff is
the database clock minus a margin longer than any ingestion transaction can stay open, so
everything received before it is committed and visible. Rerunning a period returns the run that
exists (the period is unique, and every row of a run is written once).

Voiding an invoice releases its usage (it keeps its number and lines): the next run aggregates
the released claims again beside its own and bills them as lines of their months on its invoice,
or `invoices.invoice_reissue` bills them at once on a corrective invoice of the void one's run; a
Reissue row records where, so released usage is billed again exactly once. A month's cap counts
what non-void invoices billed for it, net of credit notes, so a void frees its share of the cap.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from decimal import Context, Decimal
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Sum
from django.utils import timezone

from auditlog.services import actor_label, audit_record
from metering import fees
from metering.contracts import ContractTerms, terms_of
from metering.errors import BillingError
from metering.models import (
    BillingRecord, BillingRun, Contract, CreditNoteLine, Deployment, DeploymentReport, Invoice,
    InvoiceLine, InvoiceStatus, LineKind, RecordKind, Reissue,
)
from metering.periods import Period
from metering.usage import HOURS_QUANTUM, STATEMENT_TIMEOUT_MS
from reports.models import Report

log = logging.getLogger(__name__)

DEFAULT_CUTOFF_MARGIN_SECONDS = 300
# pg_advisory_xact_lock key that serializes billing runs with the invoice changes that move a
# month's cap (void, reissue, credit notes); any constant unique in this database.
_RUN_LOCK = 0x6D657465  # "mete"
_UNBILLED_SHOWN = 100
_WIDE = Context(prec=80)  # room for any column's digits (models.EXACT: 48)


def cutoff_margin() -> timedelta:
    seconds = int(getattr(settings, "DYNO_BILLING_CUTOFF_MARGIN_SECONDS", DEFAULT_CUTOFF_MARGIN_SECONDS))
    if seconds and seconds * 1000 < 4 * STATEMENT_TIMEOUT_MS:
        log.warning("DYNO_BILLING_CUTOFF_MARGIN_SECONDS=%s is under four ingestion statement timeouts; a slow "
                    "insert could commit behind a cutoff and never be billed", seconds)
    return timedelta(seconds=seconds)


def billing_lock() -> None:
    """Wait for any billing run, and keep runs out, until the caller's transaction ends. A run's
    cap headroom (and reconcile's recomputation of it, by timestamps) then sees a void, reissue or
    credit note wholly before or wholly after that run."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_RUN_LOCK])


# --- the pure part: groups in, planned invoices out -------------------------------------------


@dataclass(frozen=True)
class UsageGroup:
    """One row of the SQL aggregation: a deployment's usage under one report in one month."""

    deployment_id: str
    report_id: str
    usage_period: Period
    hours: Decimal
    events: int
    again: tuple[str, ...] = ()  # numbers of the void invoices whose usage this group bills again


def merge_groups(groups: Iterable[UsageGroup]) -> list[UsageGroup]:
    """One group per deployment, report and month: a run's own claim and released usage of the
    same segment become one line (a run bills a segment once)."""
    merged: dict[tuple[str, str, Period], UsageGroup] = {}
    for group in groups:
        key = (group.deployment_id, group.report_id, group.usage_period)
        seen = merged.get(key)
        merged[key] = group if seen is None else UsageGroup(
            deployment_id=group.deployment_id, report_id=group.report_id, usage_period=group.usage_period,
            hours=seen.hours + group.hours, events=seen.events + group.events,
            again=tuple(sorted(set(seen.again) | set(group.again))))
    return list(merged.values())


@dataclass(frozen=True)
class DeploymentFacts:
    id: str
    organization_id: int
    name: str
    hardware: str
    switches: tuple[fees.ReportSwitch, ...]


@dataclass(frozen=True)
class ReportFacts:
    id: str
    ci_low: Decimal
    stable: bool
    sha256: str
    key_id: str
    signature: str


@dataclass(frozen=True)
class ContractFacts:
    id: str
    organization_id: int
    effective_from: date
    effective_to: date | None
    terms: ContractTerms

    def covers(self, day: date) -> bool:
        return self.effective_from <= day and (self.effective_to is None or day < self.effective_to)


@dataclass(frozen=True)
class PlannedLine:
    kind: str  # LineKind
    usage_period: Period
    contract: ContractFacts
    line: fees.Line
    group: UsageGroup | None = None  # None for a cap line
    span: fees.Span | None = None


@dataclass(frozen=True)
class PlannedInvoice:
    organization_id: int
    currency: str
    lines: tuple[PlannedLine, ...]
    total: Decimal


@dataclass(frozen=True)
class Unbilled:
    deployment_id: str
    usage_period: Period
    hours: Decimal
    reason: str  # no_contract | hardware_not_priced


@dataclass(frozen=True)
class BillingPlan:
    invoices: tuple[PlannedInvoice, ...]
    unbilled: tuple[Unbilled, ...]


def contract_for(contracts: Iterable[ContractFacts], month: Period) -> ContractFacts | None:
    return next((c for c in contracts if c.covers(month.first_day)), None)


def plan_invoices(*, period: Period, groups: Sequence[UsageGroup], deployments: Mapping[str, DeploymentFacts],
                  reports: Mapping[str, ReportFacts], contracts: Mapping[int, Sequence[ContractFacts]],
                  billed_before: Mapping[tuple[int, Period], Decimal]) -> BillingPlan:
    """Price one run's groups: per organization and usage month, one line per segment, the
    month's cap (less what earlier runs billed for that month) as its own line, one invoice per
    organization and currency. The run's own month comes first, late months after, oldest first."""
    by_month: dict[tuple[int, Period], list[UsageGroup]] = defaultdict(list)
    for group in groups:
        by_month[(deployments[group.deployment_id].organization_id, group.usage_period)].append(group)
    unbilled: list[Unbilled] = []
    invoice_lines: dict[tuple[int, str], list[PlannedLine]] = defaultdict(list)
    for (org, month), members in sorted(by_month.items(), key=lambda item: (item[0][0], item[0][1] != period,
                                                                             item[0][1])):
        contract = contract_for(contracts.get(org, ()), month)
        if contract is None:
            unbilled += [Unbilled(g.deployment_id, month, g.hours, "no_contract") for g in members]
            continue
        segments: list[fees.Segment] = []
        spans: dict[tuple[str, str], tuple[UsageGroup, fees.Span]] = {}
        for group in members:
            deployment = deployments[group.deployment_id]
            price = contract.terms.prices.get(deployment.hardware)
            if price is None:
                unbilled.append(Unbilled(group.deployment_id, month, group.hours, "hardware_not_priced"))
                continue
            span = segment_span(deployment, group.report_id, month)
            report = reports[group.report_id]
            spans[(group.deployment_id, group.report_id)] = (group, span)
            segments.append(fees.Segment(deployment=group.deployment_id, report=group.report_id, hours=group.hours,
                                         ci_low=report.ci_low, stable=report.stable, start=span.start,
                                         end=span.end, price_per_hour=price))
        if not segments:
            continue
        segments.sort(key=lambda s: (deployments[str(s.deployment)].name, s.start))
        cap = contract.terms.monthly_cap
        if cap is not None:
            cap = max(fees.ZERO, cap - billed_before.get((org, month), fees.ZERO))
        record = fees.record_for_segments(segments=segments, contract=contract.terms.fees_contract(cap=cap))
        usage_kind = LineKind.USAGE if month == period else LineKind.ADJUSTMENT
        for line in record.lines:
            if line.kind is fees.LineKind.CAP:
                planned = PlannedLine(kind=LineKind.CAP, usage_period=month, contract=contract, line=line)
            else:
                group, span = spans[(str(line.segment.deployment), str(line.segment.report))]  # type: ignore[union-attr]
                planned = PlannedLine(kind=usage_kind, usage_period=month, contract=contract, line=line,
                                      group=group, span=span)
            invoice_lines[(org, contract.terms.currency)].append(planned)
    invoices = tuple(
        PlannedInvoice(organization_id=org, currency=currency, lines=tuple(lines),
                       total=fees.invoice_total([planned.line for planned in lines]))
        for (org, currency), lines in sorted(invoice_lines.items()))
    return BillingPlan(invoices=invoices, unbilled=tuple(unbilled))


def segment_span(deployment: DeploymentFacts, report_id: str, month: Period) -> fees.Span:
    """Where in `month` the deployment billed under `report_id` (the report's segment)."""
    for span in fees.split_period(start=month.start, end=month.end, switches=deployment.switches):
        if str(span.report) == report_id:
            return span
    raise AssertionError(f"usage of deployment {deployment.id} under report {report_id} in {month} lies outside "
                         "every span of its report history; the aggregation and split_period disagree")


# --- the database part ----------------------------------------------------------------------


_MONTH_SQL = {
    "postgresql": "(date_trunc('month', e.occurred_at AT TIME ZONE 'UTC'))::date",
    "sqlite": "date(e.occurred_at, 'start of month')",
}

_AGGREGATE_SQL = """
WITH spans AS (
    SELECT h.deployment_id, h.report_id, h.effective_from,
           LEAD(h.effective_from) OVER (PARTITION BY h.deployment_id ORDER BY h.effective_from) AS effective_to
    FROM metering_deploymentreport h
)
SELECT e.deployment_id, s.report_id, {month} AS usage_month, SUM(e.gpu_hours), COUNT(*)
FROM metering_usageevent e
JOIN spans s ON s.deployment_id = e.deployment_id AND e.occurred_at >= s.effective_from
            AND (s.effective_to IS NULL OR e.occurred_at < s.effective_to)
WHERE e.occurred_at < %(end)s AND e.received_at < %(cutoff)s {not_claimed_before} {one_claim}
GROUP BY 1, 2, 3
"""
_NOT_CLAIMED_BEFORE = "AND (e.occurred_at >= %(previous_end)s OR e.received_at >= %(previous_cutoff)s)"
_ONE_CLAIM = ("AND e.organization_id = %(organization)s AND e.occurred_at >= %(month_start)s "
              "AND e.occurred_at < %(month_end)s")


def _as_period(value: Any) -> Period:
    return Period.of(value if isinstance(value, date) else date.fromisoformat(str(value)))


def _as_hours(value: Any) -> Decimal:
    # PostgreSQL sums numeric exactly; SQLite (the demo) hands back a float of 6-place values.
    return (value if isinstance(value, Decimal) else Decimal(str(value))).quantize(HOURS_QUANTUM)


def _as_id(value: Any) -> str:
    text = str(value)
    if len(text) == 32:  # SQLite stores UUIDs without dashes
        text = f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"
    return text


def aggregate_usage(*, period: Period, cutoff: datetime, previous: BillingRun | None,
                    claim: Claim | None = None, again: tuple[str, ...] = ()) -> list[UsageGroup]:
    """The events this run claims (or only those of `claim`: one organization's usage month),
    summed per deployment, report segment and usage month, in SQL."""
    vendor = connection.vendor
    if vendor not in _MONTH_SQL:
        raise BillingError("unsupported_database", f"billing runs support PostgreSQL and SQLite, not {vendor}.")
    sql = _AGGREGATE_SQL.format(month=_MONTH_SQL[vendor], not_claimed_before=_NOT_CLAIMED_BEFORE if previous else "",
                                one_claim=_ONE_CLAIM if claim else "")
    params: dict[str, Any] = {"end": period.end, "cutoff": cutoff}
    if previous is not None:
        params.update(previous_end=Period.of(previous.period).end, previous_cutoff=previous.cutoff)
    if claim is not None:
        params.update(organization=claim.organization_id, month_start=claim.usage_period.start,
                      month_end=claim.usage_period.end)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return [UsageGroup(deployment_id=_as_id(d), report_id=_as_id(r), usage_period=_as_period(m),
                           hours=_as_hours(h), events=int(n), again=again) for d, r, m, h, n in cursor.fetchall()]


@dataclass(frozen=True, order=True)
class Claim:
    """What one run claimed of one organization's usage in one month."""

    run_id: str
    organization_id: int
    usage_period: Period


def invoice_usage(invoice: Invoice) -> set[Claim]:
    """The usage `invoice` billed: its run's claim of its organization in each usage month of its
    lines, and the usage of every void invoice billed again on it (and so on back)."""
    claims: set[Claim] = set()
    pending, seen = [invoice], set()
    while pending:
        current = pending.pop()
        if current.pk in seen:
            continue
        seen.add(current.pk)
        claims |= {Claim(str(current.run_id), current.organization_id, Period.of(month))
                   for month in current.lines.values_list("usage_period", flat=True).distinct()}
        pending += [reissue.voided for reissue in current.reissues.select_related("voided")]
    return claims


def released_invoices() -> list[Invoice]:
    """Void invoices whose usage no invoice bills again yet, oldest void first."""
    return list(Invoice.objects.filter(status=InvoiceStatus.VOID, reissue__isnull=True)
                .select_related("run").order_by("voided_at", "pk"))


def released_usage(voided: Invoice) -> list[UsageGroup]:
    """The usage a void invoice billed, aggregated again from the events, claim by claim."""
    claims = sorted(invoice_usage(voided))
    runs = {str(run.pk): run for run in BillingRun.objects.filter(pk__in={c.run_id for c in claims})
            .select_related("previous")}
    groups: list[UsageGroup] = []
    for claim in claims:
        run = runs[claim.run_id]
        groups += aggregate_usage(period=Period.of(run.period), cutoff=run.cutoff, previous=run.previous,
                                  claim=claim, again=(str(voided),))
    return groups


def _facts(groups: Sequence[UsageGroup], period: Period):
    deployment_ids = {g.deployment_id for g in groups}
    switches: dict[str, list[fees.ReportSwitch]] = defaultdict(list)
    for deployment_id, report_id, effective_from in (DeploymentReport.objects.filter(deployment_id__in=deployment_ids)
                                                     .values_list("deployment_id", "report_id", "effective_from")):
        switches[str(deployment_id)].append(fees.ReportSwitch(effective_from=effective_from, report=str(report_id)))
    deployments = {
        str(pk): DeploymentFacts(id=str(pk), organization_id=org, name=name, hardware=hardware,
                                 switches=tuple(switches[str(pk)]))
        for pk, org, name, hardware in Deployment.objects.filter(pk__in=deployment_ids)
        .values_list("pk", "organization_id", "name", "hardware")}
    reports = {
        str(pk): ReportFacts(id=str(pk), ci_low=ci_low, stable=stable, sha256=sha, key_id=key_id, signature=sig)
        for pk, ci_low, stable, sha, key_id, sig in Report.objects.filter(pk__in={g.report_id for g in groups})
        .values_list("pk", "model_ci_low", "stable", "body_sha256", "key_id", "signature")}
    org_ids = {d.organization_id for d in deployments.values()}
    contracts: dict[int, list[ContractFacts]] = defaultdict(list)
    for contract in Contract.objects.filter(organization_id__in=org_ids).order_by("effective_from"):
        contracts[contract.organization_id].append(contract_facts(contract))
    billed_before = cap_used(organization_ids=org_ids, months={g.usage_period for g in groups})
    return deployments, reports, contracts, billed_before


def cap_used(*, organization_ids: Iterable[int], months: Iterable[Period]) -> dict[tuple[int, Period], Decimal]:
    """What earlier invoices billed per organization and usage month, as caps count it: lines of
    non-void invoices (drafts too: they will be owed), less the credit notes on those lines."""
    lines = InvoiceLine.objects.filter(invoice__organization_id__in=set(organization_ids),
                                       usage_period__in={month.first_day for month in months}) \
        .exclude(invoice__status=InvoiceStatus.VOID)
    used: dict[tuple[int, Period], Decimal] = defaultdict(Decimal)
    for row in lines.values("invoice__organization_id", "usage_period").annotate(total=Sum("fee")):
        used[(row["invoice__organization_id"], Period.of(row["usage_period"]))] += row["total"]
    for row in (CreditNoteLine.objects.filter(invoice_line__in=lines)
                .values("invoice_line__invoice__organization_id", "invoice_line__usage_period")
                .annotate(total=Sum("amount"))):
        used[(row["invoice_line__invoice__organization_id"], Period.of(row["invoice_line__usage_period"]))] -= \
            row["total"]
    return dict(used)


def contract_facts(contract: Contract) -> ContractFacts:
    return ContractFacts(id=str(contract.pk), organization_id=contract.organization_id,
                         effective_from=contract.effective_from, effective_to=contract.effective_to,
                         terms=terms_of(contract))


def _database_now() -> datetime:
    if connection.vendor != "postgresql":
        return timezone.now()
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]


def _check_order(period: Period, latest: BillingRun | None) -> None:
    if latest is None:
        return
    latest_period = Period.of(latest.period)
    if latest_period >= period:
        raise BillingError("period_out_of_order", f"billing for {latest_period} already ran; periods are billed in "
                                                  f"order, and late usage of {period} is billed as an adjustment of "
                                                  "the next run.", status=409)
    if latest_period != period.previous():
        raise BillingError("previous_period_unbilled", f"the last billed period is {latest_period}; bill "
                                                       f"{latest_period.next()} first.", status=409)


@dataclass(frozen=True)
class PeriodPlan:
    """What a run of a period would invoice, read and priced but not stored: billing_run_create
    stores it, the upcoming-invoice preview (preview.py) shows it."""

    groups: list[UsageGroup]
    deployments: Mapping[str, DeploymentFacts]
    reports: Mapping[str, ReportFacts]
    plan: BillingPlan
    released: tuple[Invoice, ...] = ()  # void invoices whose usage this plan bills again


def plan_period(*, period: Period, cutoff: datetime, previous: BillingRun | None) -> PeriodPlan:
    """The events a run of `period` with `cutoff` after `previous` claims, and the usage every
    void invoice released, priced. Reads only."""
    released = released_invoices()
    groups = aggregate_usage(period=period, cutoff=cutoff, previous=previous)
    for voided in released:
        groups += released_usage(voided)
    return _priced(period=period, groups=merge_groups(groups), released=tuple(released))


def _priced(*, period: Period, groups: list[UsageGroup], released: tuple[Invoice, ...] = ()) -> PeriodPlan:
    deployments, reports, contracts, billed_before = _facts(groups, period)
    plan = plan_invoices(period=period, groups=groups, deployments=deployments, reports=reports,
                         contracts=contracts, billed_before=billed_before)
    return PeriodPlan(groups=groups, deployments=deployments, reports=reports, plan=plan, released=released)


def billing_run_create(*, period: Period, actor: Any = None, cutoff: datetime | None = None) -> tuple[BillingRun, bool]:
    """Bill `period` once: (the run, True) when this call made it, (the existing run, False) when
    the period was billed before. Refused before the period has ended (plus the cutoff margin)
    and out of order."""
    existing = BillingRun.objects.filter(period=period.first_day).first()
    if existing is not None:
        return existing, False
    started = time.monotonic()
    try:
        with transaction.atomic():
            billing_lock()
            existing = BillingRun.objects.filter(period=period.first_day).first()
            if existing is not None:
                return existing, False
            latest = BillingRun.objects.order_by("-period").first()
            _check_order(period, latest)
            now = _database_now()
            cutoff = cutoff or now - cutoff_margin()
            if cutoff > now:
                raise BillingError("invalid_cutoff", "a cutoff cannot be in the future.")
            if cutoff < period.end:
                raise BillingError("period_not_over", f"{period} ends {period.end.isoformat()}; bill it after "
                                                      f"{(period.end + cutoff_margin()).isoformat()}.", status=409)
            if latest is not None and cutoff <= latest.cutoff:
                raise BillingError("invalid_cutoff", f"the cutoff must follow the previous run's "
                                                     f"({latest.cutoff.isoformat()}).")
            planned = plan_period(period=period, cutoff=cutoff, previous=latest)
            _fits_columns(planned.plan.invoices, period)
            run = _store(period=period, cutoff=cutoff, previous=latest, planned=planned, actor=actor,
                         started=started)
    except IntegrityError:
        # Another process billed the period between our check and insert (no advisory lock on SQLite).
        existing = BillingRun.objects.filter(period=period.first_day).first()
        if existing is None:
            raise
        return existing, False
    return run, True


def _column(model: type[Any], name: str) -> tuple[Decimal, int]:
    """The first magnitude the decimal column `model.name` cannot hold, and its decimal places."""
    field = model._meta.get_field(name)
    return Decimal(10) ** (field.max_digits - field.decimal_places), field.decimal_places


# What a line's amounts are stored in: a billing record's columns (an invoice line's are the same
# or a subset), read from the models, so a column's change cannot leave this check behind.
_LINE_AMOUNTS = (("fee", "a line's fee"), ("savings", "a line's savings"), ("hours", "a line's hours"),
                 ("saved_hours", "a line's saved hours"), ("savings_exact", "a line's exact savings"),
                 ("fee_exact", "a line's exact fee"))


def _fits_columns(invoices: Iterable[PlannedInvoice], period: Period) -> None:
    """Every amount of the planned invoices fits the column that stores it, or nothing is stored.
    Past a column's magnitude: the run is refused (an amount past a column failed the whole run
    inside the database, for every organization: a red team priced a GPU-hour at 1E+20,
    2026-12-06; contract prices are bounded since). With digits past a column's places: a bug in
    the pricing (the database would round it silently), raised as one."""
    for invoice in invoices:
        amounts = [("the invoice's total", invoice.total, _column(Invoice, "total"))]
        for planned in invoice.lines:
            amounts += [(what, getattr(planned.line, name), _column(BillingRecord, name)) for name, what in _LINE_AMOUNTS]
        for what, value, (bound, places) in amounts:
            if abs(value) >= bound:
                raise BillingError("amount_out_of_range",
                                   f"{period}: {what} on organization {invoice.organization_id}'s {invoice.currency} "
                                   f"invoice is {value}, more than an invoice holds (under {bound:,}). "
                                   "Correct the contract's prices or void the usage behind it, then bill again; "
                                   "nothing was stored.", status=409)
            if value != value.quantize(Decimal(1).scaleb(-places), context=_WIDE):
                raise AssertionError(f"{period}: {what} {value} has digits past the {places} places its column "
                                     "keeps; the pricing must round it first")


def _describe(planned: PlannedLine, deployments: Mapping[str, DeploymentFacts], reports: Mapping[str, ReportFacts],
              period: Period) -> str:
    line = planned.line
    if planned.kind == LineKind.CAP:
        return f"Monthly cap for {planned.usage_period}: fees above {planned.contract.terms.monthly_cap} " \
               f"{line.currency} are not charged"
    group, span = planned.group, planned.span
    assert group is not None and span is not None, "a usage line has its group and span"
    deployment, report = deployments[group.deployment_id], reports[group.report_id]
    prefix = "" if planned.usage_period == period else f"Late usage of {planned.usage_period}: "
    if group.again:
        prefix = f"Usage of {planned.usage_period} billed again (void {', '.join(group.again)}): "
    return (f"{prefix}{deployment.name} on {deployment.hardware}, {span.start:%Y-%m-%d %H:%M}"
            f" to {span.end:%Y-%m-%d %H:%M} UTC, report {report.sha256[:12]}")


def _rows(*, run: BillingRun, invoice: Invoice, planned_invoice: PlannedInvoice, planned: PeriodPlan, period: Period,
          reissue: Reissue | None = None) -> tuple[list[BillingRecord], list[InvoiceLine]]:
    """The billing records and lines of one planned invoice, unsaved."""
    records: list[BillingRecord] = []
    lines: list[InvoiceLine] = []
    for position, planned_line in enumerate(planned_invoice.lines, start=1):
        line = planned_line.line
        record = None
        group, span = planned_line.group, planned_line.span
        if group is not None and span is not None:
            report = planned.reports[group.report_id]
            record = BillingRecord(
                run=run, organization_id=planned_invoice.organization_id, contract_id=planned_line.contract.id,
                deployment_id=group.deployment_id, report_id=group.report_id, report_sha256=report.sha256,
                report_key_id=report.key_id, report_signature=report.signature,
                kind=RecordKind.USAGE if planned_line.kind == LineKind.USAGE else RecordKind.ADJUSTMENT,
                usage_period=planned_line.usage_period.first_day, span_start=span.start, span_end=span.end,
                hardware=planned.deployments[group.deployment_id].hardware,
                events=group.events, hours=line.hours, ci_low=report.ci_low, stable=report.stable,
                speedup=line.speedup, saved_hours=line.saved_hours,
                price_per_hour=line.price_per_hour, share=line.share,
                savings_exact=line.savings_exact, fee_exact=line.fee_exact,
                savings=line.savings, fee=line.fee, currency=line.currency, rounding=line.rounding,
                reason=line.reason.value if line.reason else "", reissue=reissue)
            records.append(record)
        lines.append(InvoiceLine(
            invoice=invoice, position=position, kind=planned_line.kind, record=record,
            usage_period=planned_line.usage_period.first_day,
            description=_describe(planned_line, planned.deployments, planned.reports, period)[:300], hours=line.hours,
            speedup=line.speedup, saved_hours=line.saved_hours,
            price_per_hour=line.price_per_hour, share=line.share, savings=line.savings, fee=line.fee,
            reason=line.reason.value if line.reason else ""))
    return records, lines


def _save_rows(records: list[BillingRecord], lines: list[InvoiceLine]) -> None:
    """Records first, then lines pointed at the primary keys bulk_create gave (invoices saved already)."""
    BillingRecord.objects.bulk_create(records, batch_size=2000)
    for line in lines:
        line.invoice_id = line.invoice.pk
        line.record_id = line.record.pk if line.record is not None else None
    InvoiceLine.objects.bulk_create(lines, batch_size=2000)


def _store(*, period: Period, cutoff: datetime, previous: BillingRun | None, planned: PeriodPlan, actor: Any,
           started: float) -> BillingRun:
    plan, groups = planned.plan, planned.groups
    totals: dict[str, Decimal] = defaultdict(Decimal)
    for invoice in plan.invoices:
        totals[invoice.currency] += invoice.total
    summary = {
        "period": period.name, "cutoff": cutoff.isoformat(), "invoices": len(plan.invoices),
        "records": sum(1 for i in plan.invoices for line in i.lines if line.group is not None),
        "events": sum(g.events for g in groups), "hours": str(sum((g.hours for g in groups), Decimal(0))),
        "totals": {currency: str(total) for currency, total in sorted(totals.items())},
        "unbilled_count": len(plan.unbilled),
        "unbilled": [{"deployment": u.deployment_id, "usage_period": u.usage_period.name, "hours": str(u.hours),
                      "reason": u.reason} for u in plan.unbilled[:_UNBILLED_SHOWN]],
        "reissued": [str(voided) for voided in planned.released],
    }
    label = actor_label(actor)
    run = BillingRun.objects.create(period=period.first_day, cutoff=cutoff, previous=previous, created_by=label,
                                    summary=summary)
    records: list[BillingRecord] = []
    invoices: dict[tuple[int, str], Invoice] = {}
    lines: list[InvoiceLine] = []
    for planned_invoice in plan.invoices:
        invoice = Invoice(organization_id=planned_invoice.organization_id, run=run, period=period.first_day,
                          currency=planned_invoice.currency, total=planned_invoice.total)
        invoices[(planned_invoice.organization_id, planned_invoice.currency)] = invoice
        more_records, more_lines = _rows(run=run, invoice=invoice, planned_invoice=planned_invoice, planned=planned,
                                         period=period)
        records += more_records
        lines += more_lines
    Invoice.objects.bulk_create(list(invoices.values()), batch_size=2000)
    _save_rows(records, lines)
    for voided in planned.released:
        target = invoices.get((voided.organization_id, voided.currency))
        if target is None:
            raise AssertionError(f"run {period}: the released usage of void invoice {voided} ({voided.pk}) planned "
                                 f"no {voided.currency} invoice for organization {voided.organization_id}")
        Reissue.objects.create(voided=voided, invoice=target, created_by=label)
    audit_record(action="billing.run", actor=actor, target=f"billing-run:{period.name}",
                 data={**{key: summary[key] for key in ("period", "cutoff", "invoices", "records", "events", "hours",
                                                        "totals", "unbilled_count", "reissued")},
                       "seconds": round(time.monotonic() - started, 3)})
    return run


def invoice_rebill(*, voided: Invoice, actor: Any) -> Invoice:
    """Bill a void invoice's released usage again at once, on a corrective draft invoice of the
    same run, organization and currency, with its Reissue row. The caller holds `billing_lock`
    and the void invoice's row lock, in its transaction (invoices.invoice_reissue)."""
    run = voided.run
    period = Period.of(run.period)
    planned = _priced(period=period, groups=merge_groups(released_usage(voided)))
    if [(i.organization_id, i.currency) for i in planned.plan.invoices] != [(voided.organization_id,
                                                                              voided.currency)]:
        raise AssertionError(f"void invoice {voided} ({voided.pk}) billed {voided.currency} to organization "
                             f"{voided.organization_id}; its usage now plans "
                             f"{[(i.organization_id, i.currency) for i in planned.plan.invoices]}")
    planned_invoice = planned.plan.invoices[0]
    _fits_columns([planned_invoice], period)
    invoice = Invoice.objects.create(organization_id=voided.organization_id, run=run, period=run.period,
                                     currency=voided.currency, total=planned_invoice.total)
    reissue = Reissue.objects.create(voided=voided, invoice=invoice, created_by=actor_label(actor))
    _save_rows(*_rows(run=run, invoice=invoice, planned_invoice=planned_invoice, planned=planned, period=period,
                      reissue=reissue))
    return invoice
