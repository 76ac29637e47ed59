"""Template filters for money: an amount as its currency writes it, a period's name."""

from __future__ import annotations

from decimal import Decimal

from django import template

from metering.periods import Period
from metering.invoices import money as money_text
from metering.invoices import plain as plain_text

register = template.Library()


@register.filter
def money(amount: Decimal | None, currency: str) -> str:
    """{{ line.fee|money:invoice.currency }} -> "12.30" (JPY: "5")."""
    return money_text(amount, currency) or ""


@register.filter
def period(day) -> str:
    return Period.of(day).name if day else ""


@register.filter
def plain(value: Decimal | None) -> str:
    """{{ line.saved_hours|plain }} -> "40" (no trailing zeros, no exponent)."""
    return "" if value is None else plain_text(value)
