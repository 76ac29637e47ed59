"""What an operator scrapes: `/metrics` in Prometheus' text format (version 0.0.4).

Queue depths and runners online per hardware class, runs by status, recent run durations by stage,
audit verdicts and reason codes, billing runs and their duration, usage ingestion. Read from the database and the
broker at scrape time (nothing is kept in process memory, so every web node answers the same).
The endpoint answers only with `Authorization: Bearer $DYNO_METRICS_TOKEN`; without a token set it
does not exist (404), with a wrong one it is 401.
"""

from __future__ import annotations

import hmac
import statistics
from collections import defaultdict
from datetime import timedelta
from typing import Iterable

from django.conf import settings
from django.db import connection
from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.http import require_GET

from auditlog.models import AuditEvent
from fleet.models import Runner
from fleet.services import queue_depths
from metering.models import BillingRun, UsageEvent
from runs.models import Run, RunEvent, WorkloadResult
from runs.status import FINISHED

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
STAGE_WINDOW = timedelta(hours=24)  # run durations by stage: runs finished this recently
STAGE_RUNS = 500  # at most this many of them
INGEST_WINDOW = timedelta(minutes=5)


def _label(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class _Exposition:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def metric(self, name: str, kind: str, help_text: str, samples: Iterable[tuple[dict[str, object], float | None]]) -> None:
        self.lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        for labels, value in samples:
            if value is None:
                continue
            text = ",".join(f'{key}="{_label(val)}"' for key, val in labels.items())
            self.lines.append(f"{name}{{{text}}} {value:g}" if text else f"{name} {value:g}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def stage_seconds(*, now=None) -> dict[str, list[float]]:
    """Seconds each finished run spent in each stage (from its first event in a stage to its first
    event in the next), for runs finished in the last STAGE_WINDOW."""
    now = now or timezone.now()
    runs = list(Run.objects.filter(status__in=FINISHED, finished_at__gte=now - STAGE_WINDOW)
                .order_by("-finished_at").values_list("pk", "finished_at")[:STAGE_RUNS])
    ended = dict(runs)
    firsts: dict[object, list[tuple[str, object]]] = defaultdict(list)
    for run_id, stage, at in (RunEvent.objects.filter(run_id__in=ended).exclude(stage="")
                              .order_by("run_id", "at", "id").values_list("run_id", "stage", "at")):
        entered = firsts[run_id]
        if not entered or entered[-1][0] != stage:
            entered.append((stage, at))
    durations: dict[str, list[float]] = defaultdict(list)
    for run_id, entered in firsts.items():
        for (stage, at), (_, following) in zip(entered, [*entered[1:], ("end", ended[run_id])]):
            if following is not None and following >= at:
                durations[stage].append((following - at).total_seconds())
    return durations


# Each audited workload's reasons (a JSON list of {code, message}) counted by code in the database,
# without reading the rows into Python: one query, whatever the table's size.
REASON_COUNTS = {
    "postgresql": "SELECT r.value ->> 'code', count(*) FROM {table} w, jsonb_array_elements(CASE WHEN "
                  "jsonb_typeof(w.reasons) = 'array' THEN w.reasons ELSE '[]'::jsonb END) r GROUP BY 1",
    "sqlite": "SELECT json_extract(r.value, '$.code'), count(*) FROM {table} w, json_each(CASE WHEN "
              "json_type(w.reasons) = 'array' THEN w.reasons ELSE '[]' END) r GROUP BY 1",
}


def reason_counts() -> dict[str, int]:
    """How many audited workloads carry each reason code (a workload counts once per reason it has)."""
    query = REASON_COUNTS.get(connection.vendor)
    if query is None:
        return {}
    with connection.cursor() as cursor:
        cursor.execute(query.format(table=connection.ops.quote_name(WorkloadResult._meta.db_table)))
        return {str(code): int(n) for code, n in cursor.fetchall() if code}


def exposition() -> str:
    out = _Exposition()
    classes = list(settings.DYNO_HARDWARE_CLASSES)
    depths = queue_depths([*classes, "control"])
    out.metric("dyno_queue_depth", "gauge", "Messages waiting in a queue (absent when the broker would not say).",
               (({"queue": q}, depths.get(q)) for q in [*classes, "control"]))
    online: dict[str, int] = defaultdict(int)
    for runner in Runner.objects.all():
        online[runner.hardware] += int(runner.online)
    out.metric("dyno_runners_online", "gauge", "Registered runners heartbeating, per hardware class.",
               (({"hardware": h}, float(online.get(h, 0))) for h in classes))
    by_status = dict(Run.objects.values_list("status").annotate(n=Count("pk")).values_list("status", "n"))
    out.metric("dyno_runs", "gauge", "Runs by status.",
               (({"status": s}, float(by_status.get(s, 0))) for s in sorted({*by_status, "queued", "running"})))
    durations = stage_seconds()
    out.metric("dyno_run_stage_seconds", "summary",
               f"Seconds per stage of runs finished in the last {int(STAGE_WINDOW.total_seconds() // 3600)} hours.",
               [item for stage, values in sorted(durations.items()) for item in (
                   ({"stage": stage, "quantile": "0.5"}, statistics.median(values)),
                   ({"stage": stage, "quantile": "0.9"}, sorted(values)[int(0.9 * (len(values) - 1))]))])
    out.lines += [f'dyno_run_stage_seconds_sum{{stage="{_label(s)}"}} {sum(v):g}' for s, v in sorted(durations.items())]
    out.lines += [f'dyno_run_stage_seconds_count{{stage="{_label(s)}"}} {len(v)}' for s, v in sorted(durations.items())]
    verdicts = WorkloadResult.objects.values_list("verdict").annotate(n=Count("pk")).values_list("verdict", "n")
    out.metric("dyno_audit_verdicts_total", "counter", "Audited workloads by verdict.",
               (({"verdict": v or "none"}, float(n)) for v, n in sorted(verdicts)))
    out.metric("dyno_audit_reasons_total", "counter",
               "Audited workloads by reason code (why one was rejected, or why its figure does not bill).",
               (({"code": code}, float(n)) for code, n in sorted(reason_counts().items())))
    out.metric("dyno_billing_runs_total", "counter", "Billing runs made.", [({}, float(BillingRun.objects.count()))])
    last = AuditEvent.objects.filter(action="billing.run").order_by("-seq").values_list("data", flat=True).first()
    out.metric("dyno_billing_run_last_seconds", "gauge", "Wall time of the newest billing run.",
               [({}, float(last["seconds"]) if isinstance(last, dict) and "seconds" in last else None)])
    recent = UsageEvent.objects.filter(received_at__gte=timezone.now() - INGEST_WINDOW).count()
    out.metric("dyno_usage_events_total", "counter", "Usage events received.", [({}, float(UsageEvent.objects.count()))])
    out.metric("dyno_usage_ingest_per_second", "gauge",
               f"Usage events received per second over the last {int(INGEST_WINDOW.total_seconds())} s.",
               [({}, recent / INGEST_WINDOW.total_seconds())])
    return out.text()


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    token = settings.DYNO_METRICS_TOKEN
    if not token:
        return HttpResponse("Not found.\n", status=404, content_type="text/plain; charset=utf-8")
    given = request.META.get("HTTP_AUTHORIZATION", "")
    if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
        response = HttpResponse("Send Authorization: Bearer <DYNO_METRICS_TOKEN>.\n", status=401,
                                content_type="text/plain; charset=utf-8")
        response["WWW-Authenticate"] = "Bearer"
        return response
    return HttpResponse(exposition(), content_type=CONTENT_TYPE)
