"""Tests for metering/fees.py: the pure money rules, by hand-computed examples and properties."""

from __future__ import annotations

import decimal
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metering.fees import (
    CURRENCY_MINOR_UNITS,
    ROUNDING_MODES,
    Contract,
    LineKind,
    FeeReason,
    ReportSwitch,
    Segment,
    Span,
    apply_cap,
    billable_speedup,
    billing_line,
    invoice_total,
    record_for_segments,
    report_speedup,
    split_period,
)

D = Decimal
REPO_ROOT = Path(__file__).resolve().parents[2]

# The test's own oracle for mode names, written out rather than imported from the code under test.
ORACLE_MODES = {
    "half_even": decimal.ROUND_HALF_EVEN,
    "half_up": decimal.ROUND_HALF_UP,
    "half_down": decimal.ROUND_HALF_DOWN,
    "up": decimal.ROUND_UP,
    "down": decimal.ROUND_DOWN,
    "ceiling": decimal.ROUND_CEILING,
    "floor": decimal.ROUND_FLOOR,
}


# --- hand-computed examples ----------------------------------------------------------------------


def test_it_computes_a_simple_line_to_the_cent() -> None:
    # H = 1000 h, S = 1.37, price 2.50 EUR/h, share 30%:
    # saved = 1000 x 0.37 = 370 h; savings = 370 x 2.50 = 925.00; fee = 0.30 x 925 = 277.50.
    line = billing_line(
        hours=D("1000"), speedup=D("1.37"), price_per_hour=D("2.50"), share=D("0.30")
    )
    assert line.saved_hours == D("370")
    assert line.savings == D("925.00")
    assert line.fee == D("277.50")
    assert str(line.fee) == "277.50"
    assert line.kind is LineKind.USAGE


def test_it_rounds_each_amount_once_from_its_exact_value() -> None:
    # H = 123.4 h, S = 1.215, price 3.10 EUR/h, share 25%, half-even:
    # saved = 123.4 x 0.215 = 26.531 h; savings = 26.531 x 3.10 = 82.2461 -> 82.25;
    # fee = 0.25 x 82.2461 = 20.561525 -> 20.56.
    line = billing_line(
        hours=D("123.4"), speedup=D("1.215"), price_per_hour=D("3.10"), share="0.25"
    )
    assert line.saved_hours == D("26.531")
    assert line.savings_exact == D("82.2461")
    assert line.fee_exact == D("20.561525")
    assert (line.savings, line.fee) == (D("82.25"), D("20.56"))


def test_it_does_not_compute_the_fee_from_the_rounded_savings() -> None:
    # H = 1 h, S = 2, price 10.005 EUR/h, share 50%, half-up:
    # savings exact = 1 x 1 x 10.005 = 10.005 -> 10.01; fee exact = 0.5 x 10.005 = 5.0025 -> 5.00.
    # Rounding twice would give 0.5 x 10.01 = 5.005 -> 5.01: one cent more than the contract says.
    line = billing_line(
        hours=1, speedup=2, price_per_hour="10.005", share="0.5", rounding="half_up"
    )
    assert (line.savings, line.fee_exact, line.fee) == (D("10.01"), D("5.0025"), D("5.00"))


@pytest.mark.parametrize(
    ("rounding", "expected"),
    [
        ("half_even", "0.00"),
        ("half_up", "0.01"),
        ("half_down", "0.00"),
        ("up", "0.01"),
        ("down", "0.00"),
        ("ceiling", "0.01"),
        ("floor", "0.00"),
    ],
)
def test_it_applies_the_contracts_rounding_mode_on_a_tie(rounding: str, expected: str) -> None:
    # H = 1 h, S = 2, price 0.01 EUR/h, share 50%: fee exact = 0.005, exactly half a cent.
    line = billing_line(hours=1, speedup=2, price_per_hour="0.01", share="0.5", rounding=rounding)
    assert line.fee_exact == D("0.005")
    assert line.fee == D(expected)


def test_it_rounds_half_even_to_the_even_cent() -> None:
    # fee exact 0.015 -> 0.02 (2 is even); 0.025 -> 0.02.
    assert billing_line(hours=1, speedup=2, price_per_hour="0.03", share="0.5").fee == D("0.02")
    assert billing_line(hours=1, speedup=2, price_per_hour="0.05", share="0.5").fee == D("0.02")


def test_it_rounds_to_the_currencys_minor_unit() -> None:
    # H = 10 h, S = 1.25, price 333 JPY/h, share 30%: saved 2.5 h; savings 832.5 -> 832 (half-even,
    # 832 is even); fee = 0.3 x 832.5 = 249.75 -> 250.
    yen = billing_line(hours=10, speedup="1.25", price_per_hour=333, share="0.3", currency="JPY")
    assert (yen.savings, yen.fee) == (D("832"), D("250"))
    assert str(yen.fee) == "250"
    # 3 minor units: 0.3 x 832.5 = 249.75 BHD is already exact at 3 places.
    dinar = billing_line(hours=10, speedup="1.25", price_per_hour=333, share="0.3", currency="BHD")
    assert str(dinar.fee) == "249.750"


def test_it_bills_segments_with_their_own_speedup_and_caps_the_total() -> None:
    # One deployment, re-audited mid-period. Price 2.00 EUR/h, share 50%, minimum 1.05, cap 100:
    # report A, 400 h at S = 1.20: saved 80 h, savings 160.00, fee 80.00;
    # report B, 600 h at S = 1.10: saved 60 h, savings 120.00, fee 60.00;
    # total 140.00 > cap 100.00 -> cap line -40.00, invoice 100.00.
    contract = Contract(price_per_hour="2.00", share="0.5", minimum_speedup="1.05", cap="100")
    record = record_for_segments(
        contract=contract,
        segments=[
            Segment(deployment=7, report="A", hours=D("400"), ci_low=D("1.20")),
            Segment(deployment=7, report="B", hours=D("600"), ci_low=D("1.10")),
        ],
    )
    assert [(line.kind, line.fee) for line in record.lines] == [
        (LineKind.USAGE, D("80.00")),
        (LineKind.USAGE, D("60.00")),
        (LineKind.CAP, D("-40.00")),
    ]
    assert record.lines[2].reason is FeeReason.CAP
    assert record.lines[0].segment is not None and record.lines[0].segment.report == "A"
    assert record.total == D("100.00")
    assert str(record.total) == "100.00"


def test_it_bills_nothing_for_a_segment_below_minimum_or_unstable() -> None:
    contract = Contract(price_per_hour="2.00", share="0.5", minimum_speedup="1.05")
    record = record_for_segments(
        contract=contract,
        segments=[
            Segment(deployment=1, report="low", hours="500", ci_low="1.04"),
            Segment(deployment=1, report="shaky", hours="500", ci_low="1.50", stable=False),
            Segment(deployment=1, report="good", hours="100", ci_low="1.05"),
        ],
    )
    assert [(line.reason, line.fee) for line in record.lines] == [
        (FeeReason.BELOW_MINIMUM, D("0.00")),
        (FeeReason.UNSTABLE_REPORT, D("0.00")),
        # 100 x 0.05 = 5 h saved x 2.00 = 10.00 savings x 0.5 = 5.00.
        (None, D("5.00")),
    ]
    assert record.total == D("5.00")


def test_it_uses_the_ci_lower_bound_as_billable_speedup() -> None:
    assert billable_speedup(ci_low=D("1.31"), minimum=D("1.05")).speedup == D("1.31")
    at_minimum = billable_speedup(ci_low="1.05", minimum="1.05")
    assert (at_minimum.speedup, at_minimum.reason) == (D("1.05"), None)
    below = billable_speedup(ci_low="1.049", minimum="1.05")
    assert (below.speedup, below.reason) == (D(1), FeeReason.BELOW_MINIMUM)
    unstable = billable_speedup(ci_low="2.0", minimum="1.05", stable=False)
    assert (unstable.speedup, unstable.reason) == (D(1), FeeReason.UNSTABLE_REPORT)


def test_it_refuses_a_minimum_below_one_and_a_nonpositive_bound() -> None:
    with pytest.raises(ValueError, match="bill for a slowdown"):
        billable_speedup(ci_low="1.2", minimum="0.9")
    with pytest.raises(ValueError, match="must be positive"):
        billable_speedup(ci_low="0", minimum="1")


def test_it_adds_no_cap_line_under_or_at_the_cap_and_none_twice() -> None:
    # 100 h x 0.5 x 1.00 EUR/h x 100% = 50.00.
    line = billing_line(hours=100, speedup="1.5", price_per_hour="1.00", share="1")
    assert apply_cap([line], cap=D("50.00")) == [line]
    assert apply_cap([line], cap=None) == [line]
    capped = apply_cap([line], cap="30")
    assert [entry.fee for entry in capped] == [D("50.00"), D("-20.00")]
    assert apply_cap(capped, cap="30") == capped
    assert apply_cap([], cap="30") == []


def test_it_refuses_a_cap_finer_than_the_currency_or_negative() -> None:
    line = billing_line(hours=100, speedup="1.5", price_per_hour="1.00", share="1")
    with pytest.raises(ValueError, match="finer than the smallest EUR unit"):
        apply_cap([line], cap="10.005")
    with pytest.raises(ValueError, match="cannot be negative"):
        apply_cap([line], cap="-1")


def test_it_refuses_to_mix_currencies() -> None:
    euros = billing_line(hours=1, speedup=2, price_per_hour=1, share=1, currency="EUR")
    dollars = billing_line(hours=1, speedup=2, price_per_hour=1, share=1, currency="USD")
    with pytest.raises(ValueError, match="mix currencies"):
        invoice_total([euros, dollars])


@pytest.mark.parametrize(
    "arguments",
    [
        {"hours": 10.5},
        {"speedup": 1.2},
        {"price_per_hour": 2.5},
        {"share": 0.3},
    ],
)
def test_it_refuses_floats_and_says_what_to_pass(arguments: dict[str, float]) -> None:
    base: dict[str, object] = {
        "hours": D("10"), "speedup": D("1.2"), "price_per_hour": D("2"), "share": D("0.3")
    }
    with pytest.raises(TypeError, match="pass a Decimal or a decimal string"):
        billing_line(**{**base, **arguments})  # type: ignore[arg-type]


def test_it_refuses_floats_in_every_entry_point() -> None:
    with pytest.raises(TypeError, match="float"):
        billable_speedup(ci_low=1.2, minimum=D("1"))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="float"):
        billable_speedup(ci_low=D("1.2"), minimum=1.0)  # type: ignore[arg-type]
    line = billing_line(hours=1, speedup=2, price_per_hour=1, share=1)
    with pytest.raises(TypeError, match="float"):
        apply_cap([line], cap=10.0)  # type: ignore[arg-type]
    float_hours = Segment(deployment=1, report=1, hours=3.5, ci_low="1.2")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="float"):
        record_for_segments(
            contract=Contract(price_per_hour="1", share="0.5", minimum_speedup="1"),
            segments=[float_hours],
        )


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"hours": "-1"}, "cannot be negative"),
        ({"speedup": "0.9"}, "billable_speedup"),
        ({"price_per_hour": "-2"}, "cannot be negative"),
        ({"share": "30"}, "0.30 for 30%"),
        ({"hours": "ten"}, "not a decimal number"),
        ({"hours": "NaN"}, "finite"),
        ({"currency": "XYZ"}, "unknown currency 'XYZ'"),
        ({"rounding": "bankers"}, "unknown rounding mode 'bankers'"),
    ],
)
def test_it_refuses_impossible_line_inputs(arguments: dict[str, str], message: str) -> None:
    base = {"hours": "10", "speedup": "1.2", "price_per_hour": "2", "share": "0.3"}
    with pytest.raises(ValueError, match=message):
        billing_line(**{**base, **arguments})


def test_it_converts_a_report_float_conservatively() -> None:
    # repr(1.1) == '1.1' (Decimal(1.1) would be 1.100000000000000088817841970012523...);
    # 1.23456789 keeps 4 places rounded toward 1: 1.2345, never 1.2346.
    assert report_speedup(1.1) == D("1.1000")
    assert report_speedup(1.23456789) == D("1.2345")
    assert report_speedup("1.99999") == D("1.9999")
    with pytest.raises(TypeError):
        report_speedup(None)  # type: ignore[arg-type]


def test_it_imports_no_django() -> None:
    probe = (
        "import sys, metering.fees; "
        "print(sorted({'django', 'celery', 'torch'} & set(sys.modules)))"
    )
    completed = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == "[]"


# --- segments of a period ------------------------------------------------------------------------

T0 = datetime(2025, 3, 1, tzinfo=UTC)
T1 = datetime(2025, 4, 1, tzinfo=UTC)


def test_it_splits_a_period_at_a_re_audit() -> None:
    re_audit = T0 + timedelta(days=10)
    spans = split_period(
        start=T0,
        end=T1,
        switches=[
            ReportSwitch(effective_from=re_audit, report="B"),
            ReportSwitch(effective_from=T0 - timedelta(days=40), report="A"),
        ],
    )
    assert spans == [
        Span(start=T0, end=re_audit, report="A"),
        Span(start=re_audit, end=T1, report="B"),
    ]


def test_it_leaves_time_before_the_first_report_unbilled_and_ignores_later_switches() -> None:
    first = T0 + timedelta(days=3)
    spans = split_period(
        start=T0,
        end=T1,
        switches=[
            ReportSwitch(effective_from=first, report=1),
            ReportSwitch(effective_from=T1, report=2),
            ReportSwitch(effective_from=T1 + timedelta(days=1), report=3),
        ],
    )
    assert spans == [Span(start=first, end=T1, report=1)]
    assert split_period(start=T0, end=T1, switches=[]) == []


def test_it_refuses_ambiguous_or_naive_periods() -> None:
    with pytest.raises(ValueError, match="both take effect"):
        split_period(
            start=T0,
            end=T1,
            switches=[ReportSwitch(effective_from=T0, report="A"), ReportSwitch(T0, "B")],
        )
    with pytest.raises(ValueError, match="naive datetime"):
        split_period(start=datetime(2025, 3, 1), end=T1, switches=[])
    with pytest.raises(ValueError, match="not before end"):
        split_period(start=T1, end=T0, switches=[])


# --- properties ----------------------------------------------------------------------------------

hours_st = st.decimals(min_value=0, max_value=10**7, places=3)
speedup_st = st.decimals(min_value=1, max_value=20, places=6)
price_st = st.decimals(min_value=0, max_value=10**4, places=4)
share_st = st.decimals(min_value=0, max_value=1, places=4)
currency_st = st.sampled_from(sorted(CURRENCY_MINOR_UNITS))
rounding_st = st.sampled_from(sorted(ROUNDING_MODES))


@st.composite
def contracts(draw: st.DrawFn) -> Contract:
    currency = draw(currency_st)
    places = CURRENCY_MINOR_UNITS[currency]
    cap = draw(st.none() | st.decimals(min_value=0, max_value=10**6, places=places))
    return Contract(
        price_per_hour=draw(price_st),
        share=draw(share_st),
        minimum_speedup=draw(st.decimals(min_value=1, max_value=3, places=2)),
        currency=currency,
        rounding=draw(rounding_st),
        cap=cap,
    )


segments_st = st.lists(
    st.builds(
        Segment,
        deployment=st.integers(1, 5),
        report=st.integers(1, 5),
        hours=hours_st,
        ci_low=st.decimals(min_value="0.5", max_value=20, places=6),
        stable=st.booleans(),
    ),
    max_size=6,
)


@settings(max_examples=200, deadline=None)
@given(contract=contracts(), segments=segments_st)
def test_it_keeps_every_invariant_of_a_record(contract: Contract, segments: list[Segment]) -> None:
    record = record_for_segments(contract=contract, segments=segments)
    quantum = D(1).scaleb(-CURRENCY_MINOR_UNITS[contract.currency])
    usage = [line for line in record.lines if line.kind is LineKind.USAGE]
    caps = [line for line in record.lines if line.kind is LineKind.CAP]

    # The total is the plain sum of the rounded lines, each on the currency's quantum.
    assert record.total == sum((line.fee for line in record.lines), D(0))
    assert all(line.fee == line.fee.quantize(quantum) for line in record.lines)
    # Usage fees are never negative; only the cap line is.
    assert all(line.fee >= 0 and line.savings >= 0 for line in usage)
    assert record.total >= 0
    # Below the minimum or unstable: zero fee.
    for line, segment in zip(usage, segments, strict=True):
        if not segment.stable or D(segment.ci_low) < D(contract.minimum_speedup):
            assert line.fee == 0 and line.reason is not None
    # The cap holds, and a cap line appears only when the usage lines exceed it.
    uncapped = sum((line.fee for line in usage), D(0))
    if contract.cap is None or uncapped <= D(contract.cap):
        assert caps == [] and record.total == uncapped
    else:
        assert len(caps) == 1 and record.total == D(contract.cap)
        assert caps[0].fee == D(contract.cap) - uncapped < 0


@settings(max_examples=200, deadline=None)
@given(
    hours=hours_st,
    speedup=speedup_st,
    price=price_st,
    share=share_st,
    currency=currency_st,
    rounding=rounding_st,
)
def test_it_rounds_like_decimal_quantize_in_the_contracts_mode(
    hours: Decimal, speedup: Decimal, price: Decimal, share: Decimal, currency: str, rounding: str
) -> None:
    line = billing_line(
        hours=hours,
        speedup=speedup,
        price_per_hour=price,
        share=share,
        currency=currency,
        rounding=rounding,
    )
    quantum = D(1).scaleb(-CURRENCY_MINOR_UNITS[currency])
    with decimal.localcontext(decimal.Context(prec=200)):
        savings = hours * (speedup - 1) * price
        fee = share * savings
        assert line.savings == savings.quantize(quantum, rounding=ORACLE_MODES[rounding])
        assert line.fee == fee.quantize(quantum, rounding=ORACLE_MODES[rounding])
        assert line.fee_exact == fee


@settings(max_examples=150, deadline=None)
@given(
    hours=st.tuples(hours_st, hours_st).map(sorted),
    speedups=st.tuples(speedup_st, speedup_st).map(sorted),
    price=price_st,
    share=share_st,
    rounding=rounding_st,
)
def test_it_never_bills_less_for_more_hours_or_more_speedup(
    hours: list[Decimal],
    speedups: list[Decimal],
    price: Decimal,
    share: Decimal,
    rounding: str,
) -> None:
    def amounts(h: Decimal, s: Decimal) -> tuple[Decimal, Decimal]:
        result = billing_line(
            hours=h, speedup=s, price_per_hour=price, share=share, rounding=rounding
        )
        return result.savings, result.fee

    def no_greater(first: tuple[Decimal, Decimal], second: tuple[Decimal, Decimal]) -> bool:
        return first[0] <= second[0] and first[1] <= second[1]

    low_h, high_h = hours
    low_s, high_s = speedups
    assert no_greater(amounts(low_h, low_s), amounts(high_h, low_s))
    assert no_greater(amounts(low_h, low_s), amounts(low_h, high_s))
    assert no_greater(amounts(low_h, low_s), amounts(high_h, high_s))


@settings(max_examples=100, deadline=None)
@given(
    ci_low=st.decimals(min_value="0.01", max_value=20, places=4),
    minimum=st.decimals(min_value=1, max_value=5, places=2),
    hours=hours_st,
    price=price_st,
    share=share_st,
)
def test_it_bills_zero_below_the_minimum(
    ci_low: Decimal, minimum: Decimal, hours: Decimal, price: Decimal, share: Decimal
) -> None:
    billable = billable_speedup(ci_low=ci_low, minimum=minimum)
    line = billing_line(hours=hours, speedup=billable.speedup, price_per_hour=price, share=share)
    if ci_low < minimum:
        assert billable.reason is FeeReason.BELOW_MINIMUM
        assert line.fee == 0 and line.savings == 0
    else:
        assert billable.speedup == ci_low and billable.reason is None
