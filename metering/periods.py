"""Billing periods: calendar months in UTC, named like "2026-11".
Pure (no Django): parsing, bounds and neighbours, shared by billing, reconciliation and the pages."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime

_NAME = re.compile(r"^(\d{4})-(\d{2})$")


@dataclass(frozen=True, order=True)
class Period:
    """One month, [start, end) in UTC. Usage is billed by the month its event happened in."""

    year: int
    month: int

    def __post_init__(self) -> None:
        if not 1 <= self.month <= 12 or not 2000 <= self.year <= 9998:
            raise ValueError(f"{self.year}-{self.month:02d} is not a billing period; use YYYY-MM")

    @classmethod
    def parse(cls, text: str) -> Period:
        match = _NAME.match(text.strip()) if isinstance(text, str) else None
        if match is None:
            raise ValueError(f"period {text!r} is not a month; write it as YYYY-MM, e.g. 2026-11")
        return cls(int(match.group(1)), int(match.group(2)))

    @classmethod
    def of(cls, moment: datetime | date) -> Period:
        """The period a moment falls in (an aware datetime is read in UTC)."""
        if isinstance(moment, datetime):
            if moment.tzinfo is None:
                raise ValueError(f"{moment.isoformat()} is a naive datetime; use an aware one (UTC)")
            moment = moment.astimezone(UTC)
        return cls(moment.year, moment.month)

    @property
    def name(self) -> str:
        return f"{self.year:04d}-{self.month:02d}"

    @property
    def first_day(self) -> date:
        return date(self.year, self.month, 1)

    @property
    def start(self) -> datetime:
        return datetime(self.year, self.month, 1, tzinfo=UTC)

    @property
    def end(self) -> datetime:
        return self.next().start

    def next(self) -> Period:
        return Period(self.year + self.month // 12, self.month % 12 + 1)

    def previous(self) -> Period:
        return Period(self.year - (self.month == 1), (self.month - 2) % 12 + 1)

    def __str__(self) -> str:
        return self.name


def is_month_start(day: date) -> bool:
    return day.day == 1
