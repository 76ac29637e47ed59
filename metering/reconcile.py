"""Reconciliation: recompute every stored invoice from the raw usage events, the contract versions
and the figure each signed report body states, and list every difference, to the cent.

A second path, independent of billing on purpose, so that a bug in billing shows as a difference
instead of being repeated: it imports neither metering.fees nor metering.billing and never reads a
report's `model_ci_low` column. Events are streamed and summed in Decimal (no SQL aggregation);
each event's run is found by bisecting the runs' period ends and cutoffs, its report by bisecting
the deployment's history; S is the CI lower bound in the report's signed body; the money rule
(gates, formula, rounding, caps) is written out again here, from the contract's words. What it
takes as given are decisions people made: which invoices were voided and when, which void
invoice's usage was billed again on which invoice (Reissue rows), and credit notes with their
amounts and times. A month's cap counts, as of each invoice's moment, what this recomputation says
earlier non-void invoices billed for it, less the credit notes issued by then.
"""

from __future__ import annotations

import decimal
import hashlib
import json
from bisect import bisect_right
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import date, datetime
from decimal import Decimal
from typing import Any

from django.db.models import Prefetch

from metering.errors import BillingError
from metering.models import (
    BillingRun, Contract, CreditNoteLine, Deployment, DeploymentReport, Invoice, InvoiceLine, InvoiceStatus, Reissue,
    UsageEvent,
)
from metering.periods import Period
from reports.models import Report

ZERO = Decimal(0)
ONE = Decimal(1)
# ISO 4217 minor units of the currencies contracts may name, written out here rather than taken
# from the code under check (a wrong entry there must show as a difference).
MINOR_UNITS = {"EUR": 2, "USD": 2, "GBP": 2, "CHF": 2, "CAD": 2, "AUD": 2, "SEK": 2, "NOK": 2, "DKK": 2, "CNY": 2,
               "INR": 2, "JPY": 0, "KRW": 0, "BHD": 3, "KWD": 3}
# Products of 6-place inputs are exact far below this precision; Inexact would mean a bug here.
_EXACT = decimal.Context(prec=200, traps=[decimal.Inexact, decimal.InvalidOperation, decimal.Overflow])
_ROUND = decimal.Context(prec=200, traps=[decimal.InvalidOperation, decimal.Overflow])

Claim = tuple[int, int, date]  # (run index, organization, usage month): the events one run claimed


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
    totals: dict[str, Decimal] = field(default_factory=lambda: defaultdict(Decimal))  # `period`'s non-void invoices
    unbillable_hours: Decimal = ZERO  # before a deployment's first report, or without contract/price
    released: list[str] = field(default_factory=list)  # void invoices whose usage awaits the next run
    differences: list[Difference] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.differences


@dataclass(frozen=True)
class Figure:
    """What a signed report body states for billing: S (its CI lower bound) and the A/A verdict."""

    ci_low: Decimal | None
    stable: bool
    sha256: str  # of the body bytes, computed here
    problem: str = ""  # why the body cannot bill; "" when it can


@dataclass(frozen=True)
class ExpectedLine:
    contract_id: str
    hours: Decimal
    events: int
    ci_low: Decimal
    speedup: Decimal
    savings: Decimal
    fee: Decimal
    reason: str


@dataclass
class Bill:
    """One invoice as this recomputation expects it: the claims it bills and the moment its caps
    were decided (its run's creation, or a corrective invoice's own)."""

    run_index: int
    organization_id: int
    currency: str
    claims: set[Claim]
    as_of: datetime
    invoice: Invoice | None  # the stored invoice it is compared with
    lines: dict[tuple[str, str, date], ExpectedLine] = field(default_factory=dict)
    caps: dict[date, Decimal] = field(default_factory=dict)  # month -> cap line (negative)
    by_month: dict[date, Decimal] = field(default_factory=dict)  # month -> fees less cap line

    @property
    def total(self) -> Decimal:
        return sum(self.by_month.values(), ZERO)


def report_figure(body: bytes, sha256: str) -> Figure:
    """S and stability as the signed body states them (reports.document writes `billing`)."""
    digest = hashlib.sha256(body).hexdigest()
    if digest != sha256:
        return Figure(None, False, digest, "its body does not hash to its stored body_sha256")
    try:
        billing = json.loads(body).get("billing") or {}
        low = (billing.get("model") or {}).get("ci95_low")
    except (ValueError, AttributeError):
        return Figure(None, False, digest, "its body is not a JSON report")
    if not isinstance(low, (str, int)) or isinstance(low, bool):
        return Figure(None, False, digest, f"its body states no decimal billing.model.ci95_low ({low!r})")
    try:
        ci_low = Decimal(low)
    except decimal.InvalidOperation:
        return Figure(None, False, digest, f"its body's billing.model.ci95_low is {low!r}")
    return Figure(ci_low, billing.get("calibration_stable") is True, digest)


def price_line(*, hours: Decimal, events: int, figure: Figure, contract: Contract, price: Decimal) -> ExpectedLine:
    """The contract's rule, from its words: S is the report's CI lower bound; an unstable report or
    an S under the contract's minimum bills S = 1. Saved hours H x (S - 1), savings at the price,
    the fee the share of the savings; savings and fee each rounded once, with the contract's mode,
    to the currency's minor unit."""
    assert figure.ci_low is not None
    if not figure.stable:
        speedup, reason = ONE, "unstable_report"
    elif figure.ci_low < contract.minimum_speedup:
        speedup, reason = ONE, "below_minimum"
    else:
        speedup, reason = figure.ci_low, ""
    savings_exact = _EXACT.multiply(_EXACT.multiply(hours, _EXACT.subtract(speedup, ONE)), price)
    fee_exact = _EXACT.multiply(contract.revenue_share, savings_exact)
    return ExpectedLine(contract_id=str(contract.pk), hours=hours, events=events, ci_low=figure.ci_low,
                        speedup=speedup, savings=_rounded(savings_exact, contract),
                        fee=_rounded(fee_exact, contract), reason=reason)


def _rounded(amount: Decimal, contract: Contract) -> Decimal:
    quantum = ONE.scaleb(-MINOR_UNITS[contract.currency])
    return amount.quantize(quantum, rounding=getattr(decimal, f"ROUND_{contract.rounding.upper()}"), context=_ROUND)


def _month(moment: datetime) -> date:
    return date(moment.year, moment.month, 1)  # the ORM hands back UTC datetimes (USE_TZ)


def _contract_in_force(contracts: list[Contract], month: date) -> Contract | None:
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


class _Recomputation:
    """The state of one reconciliation: the raw facts read once, the bills, and the result."""

    def __init__(self, period: Period) -> None:
        self.runs = list(BillingRun.objects.order_by("period"))
        if not any(run.period == period.first_day for run in self.runs):
            raise BillingError("not_billed", f"{period} has no billing run to reconcile; run billing first.",
                               status=404)
        self.period = period
        self.result = Reconciliation(period=period, runs=[Period.of(run.period).name for run in self.runs])
        self.run_index = {str(run.pk): index for index, run in enumerate(self.runs)}
        sums, self.result.events, self.result.unbillable_hours = _stream(self.runs)
        self.deployments = {str(pk): (org, hardware) for pk, org, hardware in
                            Deployment.objects.values_list("pk", "organization_id", "hardware")}
        self.contracts: dict[int, list[Contract]] = defaultdict(list)
        for contract in Contract.objects.order_by("effective_from"):
            self.contracts[contract.organization_id].append(contract)
        self.figures = {str(pk): report_figure(bytes(body), sha) for pk, body, sha in
                        Report.objects.filter(pk__in={key[2] for key in sums})
                        .values_list("pk", "body", "body_sha256").iterator(chunk_size=200)}
        # What each claim holds, and each run's native claims per organization and currency.
        self.usage: dict[Claim, list[tuple[str, str, Decimal, int]]] = defaultdict(list)
        self.native: dict[tuple[int, int, str], set[Claim]] = defaultdict(set)
        for (index, deployment_id, report_id, month), (hours, count) in sums.items():
            org, hardware = self.deployments[deployment_id]
            contract = _contract_in_force(self.contracts[org], month)
            if contract is None or hardware not in contract.prices:
                self.result.unbillable_hours += hours
                continue
            self.usage[(index, org, month)].append((deployment_id, report_id, hours, count))
            self.native[(index, org, contract.currency)].add((index, org, month))
        self.invoices = {invoice.pk: invoice for invoice in Invoice.objects.prefetch_related(
            Prefetch("lines", queryset=InvoiceLine.objects.select_related("record")))}
        self.reissued_into: dict[Any, list[Invoice]] = defaultdict(list)
        self.reissue_of: dict[Any, Reissue] = {}
        for reissue in Reissue.objects.order_by("created_at", "pk"):
            self.reissued_into[reissue.invoice_id].append(self.invoices[reissue.voided_id])
            self.reissue_of[reissue.voided_id] = reissue
        self.credits: dict[Any, list[tuple[date, datetime, Decimal]]] = defaultdict(list)
        for invoice_id, month, created_at, amount in CreditNoteLine.objects.values_list(
                "invoice_line__invoice_id", "invoice_line__usage_period", "credit_note__created_at", "amount"):
            self.credits[invoice_id].append((month, created_at, amount))
        self.done: list[Bill] = []

    # --- which usage each invoice bills ---------------------------------------------------------

    def corrective(self, invoice: Invoice) -> bool:
        """An invoice made at once for a void invoice of its own run (invoice_reissue)."""
        return any(voided.run_id == invoice.run_id for voided in self.reissued_into.get(invoice.pk, ()))

    def content(self, invoice: Invoice, seen: frozenset = frozenset()) -> set[Claim]:
        if invoice.pk in seen:
            return set()
        claims: set[Claim] = set()
        if not self.corrective(invoice):
            claims |= self.native.get((self.run_index[str(invoice.run_id)], invoice.organization_id,
                                       invoice.currency), set())
        for voided in self.reissued_into.get(invoice.pk, ()):
            claims |= self.content(voided, seen | {invoice.pk})
        return claims

    def bills(self) -> list[Bill]:
        regular = {(self.run_index[str(i.run_id)], i.organization_id, i.currency): i
                   for i in self.invoices.values() if not self.corrective(i)}
        bills = []
        for key in sorted(set(self.native) | set(regular)):
            index, org, currency = key
            invoice = regular.get(key)
            claims = self.content(invoice) if invoice is not None else set(self.native[key])
            bills.append(Bill(index, org, currency, claims, self.runs[index].created_at, invoice))
        for invoice in self.invoices.values():
            if self.corrective(invoice):
                bills.append(Bill(self.run_index[str(invoice.run_id)], invoice.organization_id, invoice.currency,
                                  self.content(invoice), invoice.created_at, invoice))
        return sorted(bills, key=lambda b: (b.as_of, b.run_index, b.organization_id, b.currency))

    # --- pricing ---------------------------------------------------------------------------------

    def cap_used(self, org: int, month: date, as_of: datetime) -> Decimal:
        """What earlier invoices billed for the month as of `as_of`: those not void by then, less
        the credit notes issued on their lines by then."""
        used = ZERO
        for bill in self.done:
            if bill.organization_id != org or month not in bill.by_month:
                continue
            invoice = bill.invoice
            if invoice is not None and invoice.voided_at is not None and invoice.voided_at <= as_of:
                continue
            used += bill.by_month[month]
            if invoice is not None:
                used -= sum((amount for m, created_at, amount in self.credits.get(invoice.pk, ())
                             if m == month and created_at <= as_of), ZERO)
        return used

    def price(self, bill: Bill) -> None:
        groups: dict[tuple[str, str, date], list[Any]] = defaultdict(lambda: [ZERO, 0])
        for claim in bill.claims:
            for deployment_id, report_id, hours, count in self.usage.get(claim, ()):
                entry = groups[(deployment_id, report_id, claim[2])]
                entry[0] += hours
                entry[1] += count
        fees: dict[date, Decimal] = defaultdict(Decimal)
        for (deployment_id, report_id, month), (hours, count) in groups.items():
            contract = _contract_in_force(self.contracts[bill.organization_id], month)
            figure = self.figures[report_id]
            if figure.problem:
                self.differ(bill, "report", f"{report_id} under deployment {deployment_id}",
                            "a body that states S", figure.problem)
                continue
            assert contract is not None, "usage without a contract was counted unbillable"
            price = Decimal(str(contract.prices[self.deployments[deployment_id][1]]))
            line = price_line(hours=hours, events=count, figure=figure, contract=contract, price=price)
            bill.lines[(deployment_id, report_id, month)] = line
            fees[month] += line.fee
        for month, total in fees.items():
            contract = _contract_in_force(self.contracts[bill.organization_id], month)
            assert contract is not None, "usage without a contract was counted unbillable"
            bill.by_month[month] = total
            if contract.monthly_cap is None:
                continue
            # Contracts give caps in whole minor units; the column keeps 3 places for every currency.
            cap = contract.monthly_cap.quantize(ONE.scaleb(-MINOR_UNITS[contract.currency]),
                                                rounding=decimal.ROUND_DOWN, context=_ROUND)
            headroom = max(ZERO, cap - self.cap_used(bill.organization_id, month, bill.as_of))
            if total > headroom:
                bill.caps[month] = headroom - total
                bill.by_month[month] = headroom
        self.done.append(bill)

    # --- comparing --------------------------------------------------------------------------------

    def differ(self, bill: Bill, what: str, key: str, want: Any, got: Any) -> None:
        if bill.run_index < len(self.runs) and self.runs[bill.run_index].period <= self.period.first_day:
            self.result.differences.append(Difference(Period.of(self.runs[bill.run_index].period).name, what, key,
                                                      str(want), str(got)))

    def compare(self, bill: Bill) -> None:
        invoice = bill.invoice
        label = f"organization {bill.organization_id} {bill.currency}"
        if invoice is None:
            if bill.lines:
                self.differ(bill, "invoice", label, f"an invoice of {bill.total}", "none")
            return
        label = f"invoice {invoice} of organization {invoice.organization_id}"
        if not bill.lines:
            self.differ(bill, "invoice", label, "none (no billable usage)", f"an invoice of {invoice.total}")
            return
        lines = list(invoice.lines.all())
        stored = {(str(line.record.deployment_id), str(line.record.report_id), line.record.usage_period): line
                  for line in lines if line.record is not None}
        for key in sorted(set(bill.lines) | set(stored), key=str):
            where = f"deployment {key[0]} report {key[1]} month {key[2]:%Y-%m} on {label}"
            want, line = bill.lines.get(key), stored.get(key)
            if want is None or line is None:
                self.differ(bill, "billing record", where, "a record" if want else "none",
                            "a record" if line else "none")
                continue
            record = line.record
            for attribute in ("hours", "events", "ci_low", "speedup", "savings", "fee", "reason"):
                if getattr(want, attribute) != getattr(record, attribute):
                    self.differ(bill, attribute, where, getattr(want, attribute), getattr(record, attribute))
            if want.contract_id != str(record.contract_id):
                self.differ(bill, "contract", where, want.contract_id, record.contract_id)
            if record.report_sha256 != self.figures[key[1]].sha256:
                self.differ(bill, "report digest", where, self.figures[key[1]].sha256, record.report_sha256)
            if line.fee != record.fee:
                self.differ(bill, "invoice line of record", where, record.fee, line.fee)
        stored_caps = {line.usage_period: line.fee for line in lines if line.kind == "cap"}
        for month in sorted(set(bill.caps) | set(stored_caps)):
            if bill.caps.get(month) != stored_caps.get(month):
                self.differ(bill, "cap line", f"month {month:%Y-%m} on {label}", bill.caps.get(month),
                            stored_caps.get(month))
        line_sum = sum((line.fee for line in lines), ZERO)
        if line_sum != invoice.total:
            self.differ(bill, "invoice total vs its lines", label, line_sum, invoice.total)
        if bill.total != invoice.total:
            self.differ(bill, "invoice total", label, bill.total, invoice.total)

    def run(self) -> Reconciliation:
        period_index = next(i for i, run in enumerate(self.runs) if run.period == self.period.first_day)
        for bill in self.bills():
            self.price(bill)
            self.compare(bill)
            if bill.run_index == period_index and bill.lines and (
                    bill.invoice is None or bill.invoice.status != InvoiceStatus.VOID):
                self.result.totals[bill.currency] += bill.total
                self.result.records += len(bill.lines)
        self.result.released = sorted(str(i) for i in self.invoices.values()
                                      if i.status == InvoiceStatus.VOID and i.pk not in self.reissue_of)
        return self.result


def reconcile_period(*, period: Period) -> Reconciliation:
    """Recompute every run (later runs too: a corrective invoice's cap depends on what was billed
    before it) and report the differences of the runs up to `period`."""
    return _Recomputation(period).run()
