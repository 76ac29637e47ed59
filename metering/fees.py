"""The money rules: billable speedup -> saved hours -> savings -> fee, capped, all in Decimal.
Owns rounding (the contract's mode, once per line), currency quanta, caps and segmented usage.

Pure: no Django, no I/O. The Django side aggregates usage in SQL (hours per deployment per
segment, see `split_period`) and stores what `record_for_segments` returns.

The rules, in order (DESIGN.md "Data flow" 6 and "Trust model" 6):

- Billable speedup S is the report's 95% CI lower bound. A report whose A/A control was unstable,
  or whose lower bound is under the contract's minimum, bills S = 1: zero saved hours, zero fee,
  and the line says why (`FeeReason`).
- Saved hours = H x (S - 1); savings = saved hours x price per hour; fee = share x savings.
  Everything is exact inside (no intermediate rounding; an inexact step raises instead of
  rounding silently). Each displayed amount (savings, fee) is rounded ONCE, from its exact
  value, with the contract's rounding mode to the currency's minor unit. So the fee shown is
  share x exact savings rounded, not share x the rounded savings.
- The invoice total is the sum of the rounded line fees, never a re-rounded exact sum.
- A cap adds an explicit negative "cap" line so the total equals the cap when it would exceed it.
- Floats are refused everywhere: pass `Decimal` or a decimal string. The one bridge from a
  report's float to money is `report_speedup`.
"""

from __future__ import annotations

import decimal
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from enum import StrEnum

# Contracts name their rounding mode; these are the names a contract may use.
ROUNDING_MODES: dict[str, str] = {
    "half_even": decimal.ROUND_HALF_EVEN,
    "half_up": decimal.ROUND_HALF_UP,
    "half_down": decimal.ROUND_HALF_DOWN,
    "up": decimal.ROUND_UP,  # away from zero
    "down": decimal.ROUND_DOWN,  # toward zero
    "ceiling": decimal.ROUND_CEILING,
    "floor": decimal.ROUND_FLOOR,
}
DEFAULT_ROUNDING = "half_even"
DEFAULT_CURRENCY = "EUR"

# ISO 4217 minor units for the currencies we invoice in; add a currency here before billing in it.
CURRENCY_MINOR_UNITS: dict[str, int] = {
    "EUR": 2,
    "USD": 2,
    "GBP": 2,
    "CHF": 2,
    "CAD": 2,
    "AUD": 2,
    "SEK": 2,
    "NOK": 2,
    "DKK": 2,
    "CNY": 2,
    "INR": 2,
    "JPY": 0,
    "KRW": 0,
    "BHD": 3,
    "KWD": 3,
}

# Arithmetic context: enough precision that +, - and x are always exact, and a trap on Inexact
# so that any step that would round (a stray division, say) fails loudly instead.
_EXACT = decimal.Context(
    prec=decimal.MAX_PREC,
    Emax=decimal.MAX_EMAX,
    Emin=decimal.MIN_EMIN,
    traps=[decimal.InvalidOperation, decimal.DivisionByZero, decimal.Overflow, decimal.Inexact],
)
# Rounding to the currency happens only through `quantize` with this context (no Inexact trap).
_ROUNDING = decimal.Context(
    prec=decimal.MAX_PREC,
    Emax=decimal.MAX_EMAX,
    Emin=decimal.MIN_EMIN,
    traps=[decimal.InvalidOperation, decimal.Overflow],
)

ONE = Decimal(1)
ZERO = Decimal(0)

# Places kept when a report's float speedup becomes money input (see `report_speedup`).
SPEEDUP_PLACES = 4

Ref = int | str
DecimalInput = Decimal | str | int


class FeeReason(StrEnum):
    """Why a line bills less than its usage suggests; stored with the line, shown on invoices."""

    BELOW_MINIMUM = "below_minimum"
    UNSTABLE_REPORT = "unstable_report"
    CAP = "cap"


class LineKind(StrEnum):
    USAGE = "usage"
    CAP = "cap"


@dataclass(frozen=True)
class BillableSpeedup:
    speedup: Decimal
    reason: FeeReason | None


@dataclass(frozen=True)
class Segment:
    """Usage of one deployment under one report: one row of the SQL aggregation.

    A deployment whose report changes mid-period (a re-audit applies from its date) gives one
    segment per report; `split_period` computes their bounds.
    """

    deployment: Ref
    report: Ref
    hours: DecimalInput
    ci_low: DecimalInput
    stable: bool = True
    start: datetime | None = None
    end: datetime | None = None
    # The hardware class's price when a contract prices classes differently; None: the contract's.
    price_per_hour: DecimalInput | None = None


@dataclass(frozen=True)
class Line:
    """One invoice line. `savings` and `fee` are what is shown and summed; the `_exact` fields
    keep the unrounded values for audit. Cap lines carry zero usage and a negative fee."""

    kind: LineKind
    currency: str
    rounding: str
    hours: Decimal
    speedup: Decimal
    saved_hours: Decimal
    price_per_hour: Decimal
    share: Decimal
    savings_exact: Decimal
    fee_exact: Decimal
    savings: Decimal
    fee: Decimal
    reason: FeeReason | None = None
    segment: Segment | None = None


@dataclass(frozen=True)
class Contract:
    """The money terms of a contract, as the pure rules need them."""

    price_per_hour: DecimalInput
    share: DecimalInput
    minimum_speedup: DecimalInput
    currency: str = DEFAULT_CURRENCY
    rounding: str = DEFAULT_ROUNDING
    cap: DecimalInput | None = None


@dataclass(frozen=True)
class BillingRecord:
    currency: str
    lines: tuple[Line, ...]
    total: Decimal


@dataclass(frozen=True)
class ReportSwitch:
    """From `effective_from` on, a deployment bills under `report` (a re-audit's date)."""

    effective_from: datetime
    report: Ref


@dataclass(frozen=True)
class Span:
    """A half-open interval [start, end) of a period billed under one report."""

    start: datetime
    end: datetime
    report: Ref


def to_decimal(value: object, *, name: str) -> Decimal:
    """`value` as a finite Decimal; floats are refused because they cannot hold most decimal
    fractions (0.1 is 0.1000000000000000055511151231257827...)."""
    if isinstance(value, bool):
        raise TypeError(f"{name} is a bool ({value}); pass a Decimal or a decimal string")
    if isinstance(value, float):
        raise TypeError(
            f"{name} is a float ({value!r}); pass a Decimal or a decimal string such as "
            f"'{value!r}', since floats cannot hold most decimal fractions exactly"
        )
    if isinstance(value, Decimal):
        result = value
    elif isinstance(value, (int, str)):
        try:
            result = Decimal(value)
        except decimal.InvalidOperation:
            raise ValueError(f"{name} is {value!r}, which is not a decimal number") from None
    else:
        raise TypeError(
            f"{name} is a {type(value).__name__}; pass a Decimal or a decimal string"
        )
    if not result.is_finite():
        raise ValueError(f"{name} is {result}; money rules need a finite number")
    return result


def rounding_mode(name: str) -> str:
    """The `decimal` constant for a contract's rounding mode name."""
    try:
        return ROUNDING_MODES[name]
    except KeyError:
        raise ValueError(
            f"unknown rounding mode {name!r}; use one of {', '.join(ROUNDING_MODES)}"
        ) from None


def currency_quantum(currency: str) -> Decimal:
    """The currency's smallest unit: Decimal('0.01') for EUR, Decimal('1') for JPY."""
    try:
        places = CURRENCY_MINOR_UNITS[currency]
    except KeyError:
        raise ValueError(
            f"unknown currency {currency!r}; use an ISO 4217 code from CURRENCY_MINOR_UNITS "
            f"({', '.join(sorted(CURRENCY_MINOR_UNITS))}) or add it there with its minor units"
        ) from None
    return ONE.scaleb(-places)


def round_money(amount: Decimal, *, currency: str, rounding: str) -> Decimal:
    """`amount` rounded to the currency's minor unit with the named mode."""
    return amount.quantize(
        currency_quantum(currency), rounding=rounding_mode(rounding), context=_ROUNDING
    )


def report_speedup(value: float | int | str, *, places: int = SPEEDUP_PLACES) -> Decimal:
    """A report's speedup (a JSON float) as a Decimal, rounded DOWN to `places`.

    Goes through the float's shortest repr (1.1 -> '1.1', not 1.100000000000000088...), and
    rounds toward zero so the platform never bills more speedup than the report proves.
    """
    if isinstance(value, bool) or not isinstance(value, (float, int, str)):
        raise TypeError(f"a report speedup is a number, not {type(value).__name__}")
    text = repr(value) if isinstance(value, float) else str(value)
    exact = to_decimal(text, name="report speedup")
    return exact.quantize(ONE.scaleb(-places), rounding=decimal.ROUND_DOWN, context=_ROUNDING)


def billable_speedup(
    *, ci_low: DecimalInput, minimum: DecimalInput, stable: bool = True
) -> BillableSpeedup:
    """S = the CI lower bound, or 1 (nothing billed) with the reason when it can't be billed."""
    low = to_decimal(ci_low, name="ci_low")
    floor = to_decimal(minimum, name="minimum")
    if low <= ZERO:
        raise ValueError(f"ci_low is {low}; a speedup's confidence bound must be positive")
    if floor < ONE:
        raise ValueError(
            f"minimum is {floor}; a contract minimum below 1 would bill for a slowdown, use 1 "
            "or more"
        )
    if not stable:
        return BillableSpeedup(speedup=ONE, reason=FeeReason.UNSTABLE_REPORT)
    if low < floor:
        return BillableSpeedup(speedup=ONE, reason=FeeReason.BELOW_MINIMUM)
    return BillableSpeedup(speedup=low, reason=None)


def billing_line(
    *,
    hours: DecimalInput,
    speedup: DecimalInput,
    price_per_hour: DecimalInput,
    share: DecimalInput,
    currency: str = DEFAULT_CURRENCY,
    rounding: str = DEFAULT_ROUNDING,
    reason: FeeReason | None = None,
    segment: Segment | None = None,
) -> Line:
    """One usage line: exact saved hours, savings and fee, with savings and fee rounded once."""
    hours_d = to_decimal(hours, name="hours")
    speedup_d = to_decimal(speedup, name="speedup")
    price_d = to_decimal(price_per_hour, name="price_per_hour")
    share_d = to_decimal(share, name="share")
    if hours_d < ZERO:
        raise ValueError(
            f"hours is {hours_d}; usage cannot be negative (corrections are credit notes)"
        )
    if speedup_d < ONE:
        raise ValueError(
            f"speedup is {speedup_d}; pass the result of billable_speedup(), which bills a bound "
            "below 1 or below the minimum as 1"
        )
    if price_d < ZERO:
        raise ValueError(f"price_per_hour is {price_d}; it cannot be negative")
    if not ZERO <= share_d <= ONE:
        raise ValueError(f"share is {share_d}; it is a fraction between 0 and 1 (0.30 for 30%)")
    with decimal.localcontext(_EXACT):
        saved_hours = hours_d * (speedup_d - ONE)
        savings_exact = saved_hours * price_d
        fee_exact = share_d * savings_exact
    return Line(
        kind=LineKind.USAGE,
        currency=currency,
        rounding=rounding,
        hours=hours_d,
        speedup=speedup_d,
        saved_hours=saved_hours,
        price_per_hour=price_d,
        share=share_d,
        savings_exact=savings_exact,
        fee_exact=fee_exact,
        savings=round_money(savings_exact, currency=currency, rounding=rounding),
        fee=round_money(fee_exact, currency=currency, rounding=rounding),
        reason=reason,
        segment=segment,
    )


def invoice_total(lines: Sequence[Line]) -> Decimal:
    """The sum of the lines' rounded fees (cap lines included); Decimal('0') for no lines."""
    _common_currency(lines)
    with decimal.localcontext(_EXACT):
        return sum((line.fee for line in lines), ZERO)


def apply_cap(lines: Sequence[Line], *, cap: DecimalInput | None) -> list[Line]:
    """The lines, plus a negative cap line if their total exceeds `cap` (None: no cap).

    The cap line brings the total to exactly the cap. Applying the same cap again adds nothing.
    """
    result = list(lines)
    if cap is None or not result:
        return result
    _common_currency(result)
    currency = result[0].currency
    limit = to_decimal(cap, name="cap")
    if limit < ZERO:
        raise ValueError(f"cap is {limit}; a cap cannot be negative")
    if limit != round_money(limit, currency=currency, rounding="down"):
        raise ValueError(
            f"cap is {limit}, finer than the smallest {currency} unit "
            f"({currency_quantum(currency)}); give the cap in whole {currency} minor units"
        )
    # 100 and 100.000 EUR are the same cap; the adjustment line shows it as 100.00.
    limit = round_money(limit, currency=currency, rounding="down")
    total = invoice_total(result)
    if total <= limit:
        return result
    with decimal.localcontext(_EXACT):
        adjustment = limit - total
    zero_money = round_money(ZERO, currency=currency, rounding=result[0].rounding)
    result.append(
        Line(
            kind=LineKind.CAP,
            currency=currency,
            rounding=result[0].rounding,
            hours=ZERO,
            speedup=ONE,
            saved_hours=ZERO,
            price_per_hour=ZERO,
            share=ZERO,
            savings_exact=ZERO,
            fee_exact=adjustment,
            savings=zero_money,
            fee=adjustment,
            reason=FeeReason.CAP,
        )
    )
    return result


def record_for_segments(*, segments: Sequence[Segment], contract: Contract) -> BillingRecord:
    """One contract's billing for one period: a line per segment (in the given order), the cap
    applied once over all of them, and the total."""
    lines = []
    for segment in segments:
        billable = billable_speedup(
            ci_low=segment.ci_low, minimum=contract.minimum_speedup, stable=segment.stable
        )
        lines.append(
            billing_line(
                hours=segment.hours,
                speedup=billable.speedup,
                price_per_hour=(
                    contract.price_per_hour
                    if segment.price_per_hour is None
                    else segment.price_per_hour
                ),
                share=contract.share,
                currency=contract.currency,
                rounding=contract.rounding,
                reason=billable.reason,
                segment=segment,
            )
        )
    capped = apply_cap(lines, cap=contract.cap)
    return BillingRecord(
        currency=contract.currency, lines=tuple(capped), total=invoice_total(capped)
    )


def split_period(
    *, start: datetime, end: datetime, switches: Sequence[ReportSwitch]
) -> list[Span]:
    """The spans of [start, end) billed under each report of one deployment.

    The report in force at a moment is the one with the latest `effective_from` at or before it.
    Time before the first switch is in no span: without a report there is nothing to bill.
    The SQL side sums hours per span (start <= event time < end) to make `Segment`s.
    """
    moments = [("start", start), ("end", end)] + [
        (f"switch to report {switch.report!r}", switch.effective_from) for switch in switches
    ]
    for label, moment in moments:
        if moment.tzinfo is None or moment.utcoffset() is None:
            raise ValueError(
                f"{label} is a naive datetime ({moment.isoformat()}); use timezone-aware "
                "datetimes (UTC) so periods and switches compare unambiguously"
            )
    if not start < end:
        raise ValueError(f"the period is empty or reversed: start {start} is not before end {end}")
    ordered = sorted(switches, key=lambda switch: switch.effective_from)
    for earlier, later in zip(ordered, ordered[1:]):
        if earlier.effective_from == later.effective_from:
            raise ValueError(
                f"reports {earlier.report!r} and {later.report!r} both take effect at "
                f"{earlier.effective_from.isoformat()}; keep one"
            )
    spans = []
    for index, switch in enumerate(ordered):
        following = ordered[index + 1].effective_from if index + 1 < len(ordered) else end
        span_start = max(switch.effective_from, start)
        span_end = min(following, end)
        if span_start < span_end:
            spans.append(Span(start=span_start, end=span_end, report=switch.report))
    return spans


def _common_currency(lines: Sequence[Line]) -> str | None:
    currencies = {line.currency for line in lines}
    if len(currencies) > 1:
        raise ValueError(
            f"lines mix currencies {sorted(currencies)}; bill each currency on its own invoice"
        )
    return currencies.pop() if currencies else None
