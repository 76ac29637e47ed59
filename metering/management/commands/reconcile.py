"""`manage.py reconcile --period 2026-11`: recompute billing from raw events; exit 1 on any difference."""

from __future__ import annotations

import time

from django.core.management.base import BaseCommand, CommandError, CommandParser

from metering.errors import BillingError
from metering.periods import Period
from metering.reconcile import reconcile_period


class Command(BaseCommand):
    help = ("Recompute the billing runs up to a period from the raw usage events, contracts and reports, by a "
            "path independent of the SQL aggregation, and report every difference to the cent (exit 1).")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--period", required=True, help="the billed month, YYYY-MM")

    def handle(self, *args, period: str, **options) -> None:
        try:
            month = Period.parse(period)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        started = time.monotonic()
        try:
            result = reconcile_period(period=month)
        except BillingError as exc:
            raise CommandError(exc.message) from None
        totals = ", ".join(f"{total} {currency}" for currency, total in sorted(result.totals.items())) or "nothing"
        self.stdout.write(f"reconcile {month}: {result.events} events streamed, runs {', '.join(result.runs)} "
                          f"recomputed in {time.monotonic() - started:.1f}s; {month} billed {result.records} "
                          f"records, {totals}; {result.unbillable_hours} GPU-hours unbillable (no report, contract "
                          f"or price)")
        for difference in result.differences:
            self.stderr.write(f"DIFFERENCE {difference}")
        if not result.ok:
            self.stderr.write(f"{len(result.differences)} differences: the stored billing does not match the raw data")
            raise SystemExit(1)
        self.stdout.write("no difference: the stored billing matches the raw data to the cent")
