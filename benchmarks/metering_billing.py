"""Benchmark of a billing run: N organizations, their deployments and M usage events generated in
SQL (generate_series, not the API), then one billing run timed, with the process's peak resident memory.

A first month with a tenth of the events is billed before the measured month, so the figures
show whether time or memory grow with the number of events. Some usage of the first month
arrives late and is billed as adjustments, and a tenth of the deployments switch to a re-audit
report mid-month, so the measured run has segments, caps and adjustments.

Run: .venv/bin/python benchmarks/metering_billing.py [--orgs 1000] [--events 1000000] [--reconcile]
Writes benchmarks/results/metering-billing.json.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from datetime import date, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from metering_setup import (  # noqa: E402
    django_setup, drop_database, machine, make_customers, prepare_database, report_row, write_result,
)

DATABASE = "dyno_metering_bench_billing"

EVENTS_SQL = """
INSERT INTO metering_usageevent (organization_id, deployment_id, idempotency_key, occurred_at, gpu_hours,
                                 payload_sha256{received_column})
SELECT d.organization_id, d.id, %(tag)s || '-' || g,
       %(start)s::timestamptz + ((g::bigint * 7919) %% %(seconds)s) * interval '1 second',
       (1 + (g %% 997)) / 1000.0, md5(g::text){received_value}
FROM generate_series(0, %(count)s - 1) AS g
JOIN (SELECT id, organization_id, row_number() OVER (ORDER BY id) - 1 AS n FROM metering_deployment) AS d
  ON d.n = g %% %(deployments)s
"""


def insert_events(*, tag: str, count: int, start: datetime, seconds: int, deployments: int,
                  received: datetime | None = None) -> float:
    from django.db import connection

    sql = EVENTS_SQL.format(received_column=", received_at" if received else "",
                            received_value=", %(received)s::timestamptz" if received else "")
    began = time.monotonic()
    with connection.cursor() as cursor:
        cursor.execute(sql, {"tag": tag, "count": count, "start": start, "seconds": seconds,
                             "deployments": deployments, "received": received})
        cursor.execute("ANALYZE metering_usageevent")
    return time.monotonic() - began


class PeakRss:
    """The process's resident memory, sampled every 5 ms while the block runs (tracemalloc would
    slow the run several times over, so it is not used for the timed run)."""

    def __enter__(self) -> "PeakRss":
        self.start = self.peak = _rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, _rss())

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss())


def _rss() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def timed_run(period) -> dict:
    from metering.billing import billing_run_create
    from metering.models import BillingRecord, InvoiceLine

    with PeakRss() as memory:
        began = time.monotonic()
        run, created = billing_run_create(period=period, actor="system:benchmark")
        seconds = time.monotonic() - began
    assert created
    return {"period": period.name, "seconds": round(seconds, 3),
            "rss_start_mib": round(memory.start / 2**20, 1), "rss_peak_mib": round(memory.peak / 2**20, 1),
            "rss_growth_mib": round((memory.peak - memory.start) / 2**20, 1),
            "events": run.summary["events"], "invoices": run.summary["invoices"],
            "records": BillingRecord.objects.filter(run=run).count(),
            "adjustment_records": BillingRecord.objects.filter(run=run, kind="adjustment").count(),
            "cap_lines": InvoiceLine.objects.filter(invoice__run=run, kind="cap").count(),
            "totals": run.summary["totals"]}


def switch_some_reports(deployments, moment: datetime, every: int = 10) -> int:
    from metering.models import DeploymentReport
    from reports.models import Report
    from runs.models import Run

    chosen = deployments[::every]
    runs = Run.objects.bulk_create([Run(organization_id=d.organization_id, model_version_id=d.model_version_id,
                                        hardware=d.hardware, status="succeeded") for d in chosen])
    old = dict(DeploymentReport.objects.filter(deployment__in=chosen).values_list("deployment_id", "report_id"))
    reports = []
    for index, (deployment, run) in enumerate(zip(chosen, runs)):
        row = report_row(deployment.organization, run, 100_000 + index)
        row.kind, row.supersedes_id, row.stable = "reaudit", old[deployment.pk], True
        reports.append(row)
    reports = Report.objects.bulk_create(reports)
    DeploymentReport.objects.bulk_create([DeploymentReport(deployment=d, report=r, effective_from=moment)
                                          for d, r in zip(chosen, reports)])
    return len(chosen)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--orgs", type=int, default=1000)
    parser.add_argument("--deployments-per-org", type=int, default=2)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--reconcile", action="store_true", help="also time `reconcile` of the measured month")
    parser.add_argument("--keep", action="store_true", help="keep the benchmark database afterwards")
    args = parser.parse_args()

    django_setup(prepare_database(DATABASE))
    from django.conf import settings

    from metering.periods import Period

    settings.DYNO_BILLING_CUTOFF_MARGIN_SECONDS = 0  # generated events are committed before the run starts
    january, february = Period(2025, 1), Period(2025, 2)
    deployments = make_customers(organizations=args.orgs, deployments_per_org=args.deployments_per_org,
                                 contract_from=date(2025, 1, 1), active_from=january.start)
    count = len(deployments)
    first = args.events // 10
    load = {"january_events_s": insert_events(tag="jan", count=first, start=january.start, seconds=31 * 86400,
                                              deployments=count, received=january.end - timedelta(hours=1))}
    small = timed_run(january)
    switched = switch_some_reports(deployments, february.start + timedelta(days=14))
    late = args.events // 100
    load["late_events_s"] = insert_events(tag="late", count=late, start=january.end - timedelta(days=2),
                                          seconds=2 * 86400, deployments=count)
    load["february_events_s"] = insert_events(tag="feb", count=args.events - late, start=february.start,
                                              seconds=28 * 86400, deployments=count)
    large = timed_run(february)
    result = {
        "benchmark": "metering billing run", "command": " ".join(["benchmarks/metering_billing.py", *sys.argv[1:]]),
        "organizations": args.orgs, "deployments": count, "reports_switched_mid_month": switched,
        "load_seconds": {k: round(v, 1) for k, v in load.items()},
        "runs": [small, large], "target": "1,000 organizations and 1,000,000 events in under 10 s",
        "machine": machine(),
    }
    if args.reconcile:
        from metering.reconcile import reconcile_period

        began = time.monotonic()
        outcome = reconcile_period(period=february)
        result["reconcile"] = {"seconds": round(time.monotonic() - began, 1), "events": outcome.events,
                               "differences": len(outcome.differences)}
    path = write_result("billing", result)
    for run in result["runs"]:
        print(f"{run['period']}: {run['events']:,} events, {run['records']:,} records, {run['invoices']:,} invoices "
              f"in {run['seconds']} s, resident memory +{run['rss_growth_mib']} MiB (peak {run['rss_peak_mib']} MiB)")
    if "reconcile" in result:
        print(f"reconcile {february}: {result['reconcile']}")
    print(f"written to {path}")
    if not args.keep:
        drop_database(DATABASE)


if __name__ == "__main__":
    main()
