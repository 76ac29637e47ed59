"""Reconciliation: recompute billing runs from the raw usage events, contracts and reports by a
second path, and list every difference from what was stored, to the cent.

Independent of billing.py on purpose: events are streamed in Python and summed in Decimal (no
SQL aggregation), each event's run is found by bisecting the runs' period ends and cutoffs (not
the SQL claim predicate), its report by bisecting the deployment's history (not a window join),
and caps are carried from this recomputation of the earlier runs, not from stored lines. What it
shares with billing is the money rules themselves (fees.py), which are the specification.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import date, datetime
from decimal import Decimal
from typing import Any

from metering import fees
from metering.errors import BillingError
from metering.models import (
    BillingRecord, BillingRun, Contract, Deployment, DeploymentReport, Invoice, InvoiceLine, UsageEvent,
)
from metering.periods import Period
from reports.models import Report

ZERO = Decimal(0)


@dataclass(frozen=True)
class Difference:
    run: str  # the run's period
    what: str
    key: str
    expected: str
    stored: str

    def __str__(self) -> str:
        return f"run {self.run}: {self.what} {self.key}: expected {self.expected}, stored {self.stored}"


@dataclass
class Reconciliation:
    period: Period
    events: int = 0
    runs: list[str] = field(default_factory=list)
    records: int = 0
    totals: dict[str, Decimal] = field(default_factory=lambda: defaultdict(Decimal))  # of `period`'s run
    unbillable_hours: Decimal = ZERO  # before a deployment's first report, or without contract/price
    differences: list[Difference] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.differences


@dataclass(frozen=True)
class _Expected:
    hours: Decimal
    events: int
    speedup: Decimal
    savings: Decimal
    fee: Decimal
    reason: str


def _month(moment: datetime) -> date:
    return date(moment.year, moment.month, 1)  # the ORM hands back UTC datetimes (USE_TZ)


def _contract_terms(contracts: list[Contract], month: date) -> Contract | None:
    for contract in contracts:
        if contract.effective_from <= month and (contract.effective_to is None or month < contract.effective_to):
            return contract
    return None


def _stream(runs: list[BillingRun]) -> tuple[dict, int, Decimal]:
    """(run index, deployment, report, month) -> [hours, events], streaming every event once."""
    ends = [Period.of(run.period).end for run in runs]
    cutoffs = [run.cutoff for run in runs]
    history: dict[str, tuple[list[datetime], list[str]]] = defaultdict(lambda: ([], []))
    for deployment_id, report_id, effective_from in (DeploymentReport.objects.order_by("deployment_id", "effective_from")
                                                     .values_list("deployment_id", "report_id", "effective_from")):
        times, reports = history[str(deployment_id)]
        times.append(effective_from)
        reports.append(str(report_id))
    sums: dict[tuple[int, str, str, date], list[Any]] = defaultdict(lambda: [ZERO, 0])
    events = 0
    orphan = ZERO
    stream = (UsageEvent.objects.filter(received_at__lt=cutoffs[-1], occurred_at__lt=ends[-1])
              .values_list("deployment_id", "occurred_at", "gpu_hours", "received_at")
              .iterator(chunk_size=20_000))
    for deployment_id, occurred_at, hours, received_at in stream:
        events += 1
        run = max(bisect_right(ends, occurred_at), bisect_right(cutoffs, received_at))
        times, reports = history[str(deployment_id)]
        position = bisect_right(times, occurred_at) - 1
        if position < 0:
            orphan += hours
            continue
        entry = sums[(run, str(deployment_id), reports[position], _month(occurred_at))]
        entry[0] += hours
        entry[1] += 1
    return sums, events, orphan


def reconcile_period(*, period: Period) -> Reconciliation:
    runs = list(BillingRun.objects.filter(period__lte=period.first_day).order_by("period"))
    if not runs or runs[-1].period != period.first_day:
        raise BillingError("not_billed", f"{period} has no billing run to reconcile; run billing first.", status=404)
    result = Reconciliation(period=period, runs=[Period.of(run.period).name for run in runs])
    sums, result.events, result.unbillable_hours = _stream(runs)
    deployments = {str(pk): (org, hw) for pk, org, hw in
                   Deployment.objects.values_list("pk", "organization_id", "hardware")}
    reports = {str(pk): (ci, stable, sha) for pk, ci, stable, sha in
               Report.objects.filter(pk__in={key[2] for key in sums})
               .values_list("pk", "model_ci_low", "stable", "body_sha256")}
    contracts: dict[int, list[Contract]] = defaultdict(list)
    for contract in Contract.objects.order_by("effective_from"):
        contracts[contract.organization_id].append(contract)
    billed: dict[tuple[int, date], Decimal] = defaultdict(Decimal)  # what earlier runs billed per org and month
    for index, run in enumerate(runs):
        by_month: dict[tuple[int, date], list[fees.Segment]] = defaultdict(list)
        counts: dict[tuple[str, str, date], int] = {}
        for (run_index, deployment_id, report_id, month), (hours, count) in sums.items():
            if run_index != index:
                continue
            org, hardware = deployments[deployment_id]
            contract = _contract_terms(contracts[org], month)
            if contract is None or hardware not in contract.prices:
                result.unbillable_hours += hours
                continue
            ci_low, stable, _ = reports[report_id]
            counts[(deployment_id, report_id, month)] = count
            by_month[(org, month)].append(fees.Segment(
                deployment=deployment_id, report=report_id, hours=hours, ci_low=ci_low, stable=stable,
                price_per_hour=fees.to_decimal(contract.prices[hardware], name="price")))
        expected: dict[tuple[str, str, date], _Expected] = {}
        caps: dict[tuple[int, date], Decimal] = {}
        totals: dict[tuple[int, str], Decimal] = defaultdict(Decimal)
        for (org, month), segments in by_month.items():
            contract = _contract_terms(contracts[org], month)
            cap = None if contract.monthly_cap is None else max(ZERO, contract.monthly_cap - billed[(org, month)])
            money = fees.record_for_segments(segments=segments, contract=fees.Contract(
                price_per_hour=ZERO, share=contract.revenue_share, minimum_speedup=contract.minimum_speedup,
                currency=contract.currency, rounding=contract.rounding, cap=cap))
            for line in money.lines:
                if line.kind is fees.LineKind.CAP:
                    caps[(org, month)] = line.fee
                    continue
                key = (str(line.segment.deployment), str(line.segment.report), month)
                expected[key] = _Expected(line.hours, counts[key], line.speedup, line.savings, line.fee,
                                          line.reason.value if line.reason else "")
            billed[(org, month)] += money.total
            totals[(org, contract.currency)] += money.total
        _compare(result, run, expected, caps, dict(totals), reports)
        if index == len(runs) - 1:
            for (_, currency), total in totals.items():
                result.totals[currency] += total
            result.records = len(expected)
    return result


def _compare(result: Reconciliation, run: BillingRun, expected: dict, caps: dict, totals: dict, reports: dict) -> None:
    name = Period.of(run.period).name

    def differ(what: str, key: str, want: Any, got: Any) -> None:
        result.differences.append(Difference(name, what, key, str(want), str(got)))

    stored = {(str(r.deployment_id), str(r.report_id), r.usage_period): r
              for r in BillingRecord.objects.filter(run=run).select_related("line")}
    for key in sorted(set(expected) | set(stored), key=str):
        label = f"deployment {key[0]} report {key[1]} month {key[2]:%Y-%m}"
        want, got = expected.get(key), stored.get(key)
        if want is None or got is None:
            differ("billing record", label, "a record" if want else "none", "a record" if got else "none")
            continue
        for attribute in ("hours", "events", "speedup", "savings", "fee", "reason"):
            if getattr(want, attribute) != getattr(got, attribute):
                differ(attribute, label, getattr(want, attribute), getattr(got, attribute))
        if got.report_sha256 != reports[key[1]][2]:
            differ("report digest", label, reports[key[1]][2], got.report_sha256)
        line = getattr(got, "line", None)
        if line is None or line.fee != got.fee:
            differ("invoice line of record", label, got.fee, line.fee if line else "no line")
    stored_caps = {(line.invoice.organization_id, line.usage_period): line.fee for line in
                   InvoiceLine.objects.filter(invoice__run=run, kind="cap").select_related("invoice")}
    for key in sorted(set(caps) | set(stored_caps), key=str):
        if caps.get(key) != stored_caps.get(key):
            differ("cap line", f"organization {key[0]} month {key[1]:%Y-%m}", caps.get(key), stored_caps.get(key))
    for invoice in Invoice.objects.filter(run=run).prefetch_related("lines"):
        line_sum = sum((line.fee for line in invoice.lines.all()), ZERO)
        key = f"invoice {invoice} of organization {invoice.organization_id}"
        if line_sum != invoice.total:
            differ("invoice total vs its lines", key, line_sum, invoice.total)
        want = totals.pop((invoice.organization_id, invoice.currency), None)
        if want != invoice.total:
            differ("invoice total", key, want, invoice.total)
    for (org, currency), total in totals.items():
        differ("invoice", f"organization {org} {currency}", total, "none")
