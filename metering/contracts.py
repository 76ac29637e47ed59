"""Contracts: parsing money terms, adding a version from a month, ending a version.
A version in force is never edited (the database refuses it too, migration 0002); a change is a
new version from a later month, which closes the open end of the version before it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from accounts.models import Organization
from auditlog.services import actor_label, audit_record
from metering import fees
from metering.errors import BillingError
from metering.models import BillingRun, Contract
from metering.periods import Period
from runs.shapes import MAX_BATCH, MAX_SEQ  # what a run may measure: a plan pinning more is refused

MAX_PLACES = 6  # shares, prices and speedups carry at most 6 decimal places (models.RATE etc.)
MAX_DISPUTE_DAYS = 365
# Far above any real price or cap, far below what the money columns hold (models.MONEY: under 10^17):
# an unbounded price was stored, then overflowed the month's billing run for every organization
# (a red team, 2026-12-06); billing checks each amount against its column as well (billing._fits_columns).
MAX_PRICE_PER_HOUR = Decimal(1_000_000)
MAX_MONTHLY_CAP = Decimal(10) ** 12
# The scalar fields a form or an API body gives (prices and the measurement plan aside).
TERMS_FIELDS = ("revenue_share", "minimum_speedup", "monthly_cap", "currency", "rounding", "dispute_window_days",
                "suite_version", "suite_manifest_sha256", "baseline", "batch", "seq")


@dataclass(frozen=True)
class ContractTerms:
    """The money terms and measurement plan of one contract version, validated."""

    revenue_share: Decimal
    prices: dict[str, Decimal]
    minimum_speedup: Decimal
    suite_version: str
    baseline: str
    currency: str = fees.DEFAULT_CURRENCY
    rounding: str = fees.DEFAULT_ROUNDING
    monthly_cap: Decimal | None = None
    dispute_window_days: int = 30
    suite_manifest_sha256: str = ""
    # The shape the model is measured and billed at; None: any (the organization's first stable
    # report of an artifact, at whatever shape its first run had, is the one in force).
    batch: int | None = None
    seq: int | None = None

    def fees_contract(self, *, cap: Decimal | None) -> fees.Contract:
        """The pure rules' view. Prices are per hardware class, so each segment carries its own."""
        return fees.Contract(price_per_hour=fees.ZERO, share=self.revenue_share,
                             minimum_speedup=self.minimum_speedup, currency=self.currency,
                             rounding=self.rounding, cap=cap)


def _decimal(data: Mapping[str, Any], name: str, *, required: bool = True) -> Decimal | None:
    value = data.get(name)
    if value is None or value == "":
        if required:
            raise BillingError("missing_field", f"{name} is required (a decimal string such as \"0.20\").")
        return None
    try:
        number = fees.to_decimal(value, name=name)
    except (TypeError, ValueError) as exc:
        raise BillingError("invalid_field", str(exc)) from None
    if number.as_tuple().exponent < -MAX_PLACES:  # type: ignore[operator]
        raise BillingError("invalid_field", f"{name} is {number}: at most {MAX_PLACES} decimal places.")
    return number


def contract_terms_from(data: Mapping[str, Any]) -> ContractTerms:
    """Terms from an API body or a form: decimal strings, a prices object, a measurement plan."""
    share = _decimal(data, "revenue_share")
    minimum = _decimal(data, "minimum_speedup")
    cap = _decimal(data, "monthly_cap", required=False)
    currency = str(data.get("currency") or fees.DEFAULT_CURRENCY).upper()
    rounding = str(data.get("rounding") or fees.DEFAULT_ROUNDING)
    plan = data.get("measurement_plan") or {}
    if not isinstance(plan, Mapping):
        raise BillingError("invalid_field", "measurement_plan is an object: {suite_version, baseline, "
                                            "suite_manifest_sha256, batch, seq}.")
    suite_version = str(plan.get("suite_version") or data.get("suite_version") or "").strip()
    baseline = str(plan.get("baseline") or data.get("baseline") or "").strip()
    manifest = str(plan.get("suite_manifest_sha256") or data.get("suite_manifest_sha256") or "").strip().lower()
    batch, seq = _shape({name: plan.get(name, data.get(name)) for name in ("batch", "seq")})
    raw_prices = data.get("prices")
    if not isinstance(raw_prices, Mapping) or not raw_prices:
        raise BillingError("missing_field", "prices is required: an object of hardware class -> price per "
                                            "GPU-hour as a decimal string, e.g. {\"gpu-h100\": \"2.50\"}.")
    prices = {str(hw): _decimal(raw_prices, hw) for hw in raw_prices}
    try:
        window = int(data.get("dispute_window_days") or 30)
    except (TypeError, ValueError):
        raise BillingError("invalid_field", "dispute_window_days is a whole number of days.") from None
    terms = ContractTerms(revenue_share=share, prices=prices, minimum_speedup=minimum,  # type: ignore[arg-type]
                          suite_version=suite_version, baseline=baseline, currency=currency, rounding=rounding,
                          monthly_cap=cap, dispute_window_days=window, suite_manifest_sha256=manifest,
                          batch=batch, seq=seq)
    contract_terms_check(terms)
    return terms


def _shape(plan: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """The plan's batch and sequence length, each a whole number or None."""
    found = {}
    for name in ("batch", "seq"):
        value = plan.get(name)
        if value is None or value == "":
            found[name] = None
            continue
        if isinstance(value, bool) or not isinstance(value, (int, str)) or not str(value).strip().isdigit():
            raise BillingError("invalid_field", f"measurement_plan.{name} is {value!r}: a whole number (the "
                                                f"{'batch size' if name == 'batch' else 'sequence length'} the model "
                                                "is measured and billed at).")
        found[name] = int(str(value).strip())
    return found["batch"], found["seq"]  # together or neither: contract_terms_check


def contract_terms_check(terms: ContractTerms) -> None:
    """Every rule the terms must meet, with a message that says which and how to fix it."""
    if not fees.ZERO <= terms.revenue_share <= fees.ONE:
        raise BillingError("invalid_field", f"revenue_share is {terms.revenue_share}: a fraction between 0 and 1 "
                                            "(0.20 for 20%).")
    if terms.minimum_speedup < fees.ONE:
        raise BillingError("invalid_field", f"minimum_speedup is {terms.minimum_speedup}: 1 or more (1.05 bills "
                                            "only proven speedups of at least 5%).")
    if terms.currency not in fees.CURRENCY_MINOR_UNITS:
        raise BillingError("invalid_field", f"currency {terms.currency!r} is not invoiced; use one of "
                                            f"{', '.join(sorted(fees.CURRENCY_MINOR_UNITS))}.")
    if terms.rounding not in fees.ROUNDING_MODES:
        raise BillingError("invalid_field", f"rounding {terms.rounding!r} is unknown; use one of "
                                            f"{', '.join(fees.ROUNDING_MODES)}.")
    if terms.monthly_cap is not None:
        if terms.monthly_cap > MAX_MONTHLY_CAP:
            raise BillingError("invalid_field", f"monthly_cap is {terms.monthly_cap}: at most {MAX_MONTHLY_CAP:,} "
                                                f"{terms.currency}; leave it out for no cap.")
        whole = fees.round_money(terms.monthly_cap, currency=terms.currency, rounding="down")
        if terms.monthly_cap < 0 or terms.monthly_cap != whole:
            raise BillingError("invalid_field", f"monthly_cap is {terms.monthly_cap}: a non-negative amount in whole "
                                                f"{terms.currency} minor units.")
    known = set(settings.DYNO_HARDWARE_CLASSES)
    for hardware, price in terms.prices.items():
        if hardware not in known:
            raise BillingError("invalid_field", f"prices names hardware class {hardware!r}; known classes are "
                                                f"{', '.join(sorted(known))}.")
        if price < 0:
            raise BillingError("invalid_field", f"the price for {hardware} is {price}; prices cannot be negative.")
        if price > MAX_PRICE_PER_HOUR:
            raise BillingError("invalid_field", f"the price for {hardware} is {price} per GPU-hour; at most "
                                                f"{MAX_PRICE_PER_HOUR:,} is accepted.")
    if not 0 <= terms.dispute_window_days <= MAX_DISPUTE_DAYS:
        raise BillingError("invalid_field", f"dispute_window_days is {terms.dispute_window_days}: 0 to "
                                            f"{MAX_DISPUTE_DAYS}.")
    if not terms.suite_version:
        raise BillingError("missing_field", "the measurement plan needs suite_version (the audited suite the "
                                            "speedup is measured on, e.g. \"v1\").")
    if not terms.baseline:
        raise BillingError("missing_field", "the measurement plan needs baseline: the billed baseline as agreed "
                                            "(e.g. \"eager PyTorch with standard ops\").")
    if (terms.batch is None) != (terms.seq is None):
        raise BillingError("invalid_field", "measurement_plan pins batch and seq together (the shape the model is "
                                            "measured and billed at), or neither.")
    if terms.batch is not None and terms.seq is not None and not (
            1 <= terms.batch <= MAX_BATCH and 1 <= terms.seq <= MAX_SEQ):
        raise BillingError("invalid_field", f"measurement_plan's shape is batch {terms.batch} x seq {terms.seq}: a run "
                                            f"measures batch 1 to {MAX_BATCH} and seq 1 to {MAX_SEQ}.")


def terms_of(contract: Contract) -> ContractTerms:
    """A stored version's terms (prices back from decimal strings)."""
    return ContractTerms(
        revenue_share=contract.revenue_share,
        prices={hw: fees.to_decimal(price, name=f"price for {hw}") for hw, price in contract.prices.items()},
        minimum_speedup=contract.minimum_speedup, suite_version=contract.suite_version, baseline=contract.baseline,
        currency=contract.currency, rounding=contract.rounding, monthly_cap=contract.monthly_cap,
        dispute_window_days=contract.dispute_window_days, suite_manifest_sha256=contract.suite_manifest_sha256,
        batch=contract.measured_batch, seq=contract.measured_seq,
    )


def billed_horizon() -> date | None:
    """The first day after the latest billed period: nothing may change before it."""
    latest = BillingRun.objects.order_by("-period").values_list("period", flat=True).first()
    return Period.of(latest).next().first_day if latest else None


def contract_version_create(*, organization: Organization, terms: ContractTerms, effective_from: date, actor: Any,
                            today: date | None = None) -> Contract:
    """Add a version from the first day of a month. A later version closes the open end of the
    one before it; versions never overlap, never start in a billed month, and a change never
    reaches back into a month that has begun (the first version may start this month)."""
    contract_terms_check(terms)
    today = today or timezone.now().date()
    if effective_from.day != 1:
        raise BillingError("invalid_field", f"effective_from is {effective_from}: contracts change on the first day "
                                            f"of a month, e.g. {Period.of(effective_from).next().first_day}.")
    horizon = billed_horizon()
    if horizon and effective_from < horizon:
        raise BillingError("billed_period", f"{effective_from:%Y-%m} is already billed; a new version starts at "
                                            f"{horizon} or later.", status=409)
    with transaction.atomic():
        versions = list(Contract.objects.select_for_update().filter(organization=organization)
                        .order_by("effective_from"))
        latest = versions[-1] if versions else None
        if latest is None and effective_from < Period.of(today).first_day:
            raise BillingError("invalid_field", f"a first contract starts this month or later, not {effective_from}.")
        if latest is not None:
            if effective_from <= today:
                raise BillingError("contract_in_force", f"{effective_from} has begun; the version in force keeps its "
                                                        f"terms, so a change starts {Period.of(today).next().first_day}"
                                                        " or later.", status=409)
            if effective_from <= latest.effective_from:
                raise BillingError("contract_overlap", f"version {latest.version} starts {latest.effective_from}; a "
                                                       "new version starts after it.", status=409)
            if latest.effective_to is None:
                Contract.objects.filter(pk=latest.pk, effective_to__isnull=True).update(effective_to=effective_from)
            elif latest.effective_to > effective_from:
                raise BillingError("contract_overlap", f"version {latest.version} runs until {latest.effective_to}; a "
                                                       f"new version starts then or later.", status=409)
        try:
            contract = Contract.objects.create(
                organization=organization, version=(latest.version + 1) if latest else 1,
                effective_from=effective_from, revenue_share=terms.revenue_share,
                prices={hw: str(price) for hw, price in sorted(terms.prices.items())},
                minimum_speedup=terms.minimum_speedup, monthly_cap=terms.monthly_cap, currency=terms.currency,
                rounding=terms.rounding, dispute_window_days=terms.dispute_window_days,
                suite_version=terms.suite_version, suite_manifest_sha256=terms.suite_manifest_sha256,
                baseline=terms.baseline, measured_batch=terms.batch, measured_seq=terms.seq,
                created_by=actor_label(actor),
            )
        except IntegrityError as exc:
            raise BillingError("contract_overlap", f"this version would overlap another one ({exc}).",
                               status=409) from None
        audit_record(action="contract.version_created", actor=actor, organization_id=organization.pk,
                     target=f"contract:{contract.pk}", data=contract_data(contract))
    return contract


def contract_end(*, contract: Contract, effective_to: date, actor: Any, today: date | None = None) -> Contract:
    """Close an open-ended version at the first day of a later month (the customer leaves)."""
    today = today or timezone.now().date()
    if effective_to.day != 1 or effective_to <= today or effective_to <= contract.effective_from:
        raise BillingError("invalid_field", f"a contract ends on the first day of a month after today and after it "
                                            f"started; {effective_to} is not.")
    with transaction.atomic():
        changed = Contract.objects.filter(pk=contract.pk, effective_to__isnull=True).update(effective_to=effective_to)
        if not changed:
            raise BillingError("contract_closed", f"version {contract.version} already ends "
                                                  f"{contract.effective_to}.", status=409)
        audit_record(action="contract.ended", actor=actor, organization_id=contract.organization_id,
                     target=f"contract:{contract.pk}", data={"effective_to": effective_to.isoformat()})
    contract.refresh_from_db()
    return contract


def contract_data(contract: Contract) -> dict[str, Any]:
    """The API's and the audit log's view of a version: money as decimal strings."""
    return {
        "id": str(contract.pk), "organization": contract.organization.slug, "version": contract.version,
        "effective_from": contract.effective_from.isoformat(),
        "effective_to": contract.effective_to.isoformat() if contract.effective_to else None,
        "revenue_share": str(contract.revenue_share), "prices": dict(contract.prices),
        "minimum_speedup": str(contract.minimum_speedup),
        "monthly_cap": None if contract.monthly_cap is None else str(contract.monthly_cap),
        "currency": contract.currency, "rounding": contract.rounding,
        "dispute_window_days": contract.dispute_window_days,
        "measurement_plan": {"suite_version": contract.suite_version,
                             "suite_manifest_sha256": contract.suite_manifest_sha256 or None,
                             "baseline": contract.baseline,
                             "batch": contract.measured_batch, "seq": contract.measured_seq},
        "created_at": contract.created_at.isoformat() if contract.created_at else None,
    }
