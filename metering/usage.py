"""Usage ingestion: a batch of GPU-hour events checked one by one and written with one
multi-row INSERT ... ON CONFLICT DO NOTHING, so the database decides what is new.

Same idempotency key and same payload: `duplicate`, nothing changes. Same key, different payload:
`rejected` (idempotency_conflict). The unique constraint on (organization, key) is the arbiter, in
the same transaction as the insert, so two concurrent posts of one batch count it once.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal, InvalidOperation
from enum import StrEnum
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from api.bounded import InputRejected, moment_bounded
from metering.models import Deployment, UsageEvent

MAX_EVENTS = 1000
MAX_KEY_LENGTH = 200
MAX_AGE = timedelta(days=35)
MAX_AHEAD = timedelta(minutes=5)
MAX_EVENT_HOURS = Decimal(1_000_000)
HOURS_QUANTUM = Decimal("0.000001")
# Each statement of an ingestion transaction, and each pause between them, is cut off after this,
# so an event is committed within a few times this after its received_at, or not at all. The
# billing cutoff margin is well above that, so every event received before a cutoff is visible
# to that run (billing.cutoff_margin).
STATEMENT_TIMEOUT_MS = 30_000


class Status(StrEnum):
    CREATED = "created"
    DUPLICATE = "duplicate"
    REJECTED = "rejected"


class Rejection(StrEnum):
    INVALID_EVENT = "invalid_event"
    INVALID_KEY = "invalid_idempotency_key"
    DEPLOYMENT_NOT_FOUND = "deployment_not_found"
    INVALID_TIMESTAMP = "invalid_timestamp"
    TIMESTAMP_TOO_OLD = "timestamp_too_old"
    TIMESTAMP_IN_FUTURE = "timestamp_in_future"
    BEFORE_DEPLOYMENT = "before_deployment"
    INVALID_GPU_HOURS = "invalid_gpu_hours"
    IDEMPOTENCY_CONFLICT = "idempotency_conflict"


@dataclass(frozen=True, slots=True)
class EventResult:
    idempotency_key: str | None
    status: Status
    code: Rejection | None = None
    message: str = ""

    def as_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"idempotency_key": self.idempotency_key, "status": self.status.value}
        if self.code is not None:
            data["reason"] = {"code": self.code.value, "message": self.message}
        return data


class _Rejected(Exception):
    def __init__(self, code: Rejection, message: str) -> None:
        self.code, self.message = code, message


def payload_digest(*, deployment: str, occurred_at: datetime, gpu_hours: Decimal) -> str:
    """The identity of an event's content: what "same payload" means for an idempotency key.
    Normalized, so 1.5 and 1.500000 hours, or +01:00 and Z times of one instant, are the same."""
    text = f"{deployment}|{occurred_at.astimezone(UTC).isoformat(timespec='microseconds')}|" \
           f"{gpu_hours.quantize(HOURS_QUANTUM)}"
    return hashlib.sha256(text.encode()).hexdigest()


def _timestamp(value: Any, *, oldest: datetime, newest: datetime) -> datetime:
    """The event's instant in UTC (parsed and converted inside api.bounded's guard), then inside
    the ingestion window."""
    try:
        moment = moment_bounded(value, what="timestamp")
    except InputRejected as exc:
        raise _Rejected(Rejection.INVALID_TIMESTAMP, exc.message) from None
    if moment < oldest:
        raise _Rejected(Rejection.TIMESTAMP_TOO_OLD,
                        f"timestamp {value} is more than {MAX_AGE.days} days old; such usage is no longer accepted.")
    if moment > newest:
        raise _Rejected(Rejection.TIMESTAMP_IN_FUTURE,
                        f"timestamp {value} is more than {int(MAX_AHEAD.total_seconds() // 60)} minutes ahead of the "
                        "server's clock; check the sender's clock.")
    return moment


def _hours(value: Any) -> Decimal:
    if not isinstance(value, str):
        raise _Rejected(Rejection.INVALID_GPU_HOURS,
                        "gpu_hours is a decimal string such as \"1.25\" (JSON numbers are floats and inexact).")
    try:
        hours = Decimal(value)
    except InvalidOperation:
        raise _Rejected(Rejection.INVALID_GPU_HOURS, f"gpu_hours {value[:40]!r} is not a decimal number.") from None
    if not hours.is_finite() or hours <= 0:
        raise _Rejected(Rejection.INVALID_GPU_HOURS, f"gpu_hours is {value[:40]}; it must be a positive number.")
    if hours.as_tuple().exponent < -6:  # type: ignore[operator]
        raise _Rejected(Rejection.INVALID_GPU_HOURS,
                        f"gpu_hours {value[:40]} has more than 6 decimal places; round it yourself, we do not.")
    if hours > MAX_EVENT_HOURS:
        raise _Rejected(Rejection.INVALID_GPU_HOURS,
                        f"gpu_hours {value[:40]} exceeds {MAX_EVENT_HOURS} in one event; split it into several.")
    return hours.quantize(HOURS_QUANTUM)


def _deployments(organization_id: int, raw_ids: set[str]) -> dict[str, tuple[str, datetime]]:
    """The organization's deployments among `raw_ids`, keyed by the text the client sent."""
    parsed: dict[str, uuid.UUID] = {}
    for raw in raw_ids:
        try:
            parsed[raw] = uuid.UUID(raw)
        except (ValueError, AttributeError, TypeError):
            continue
    found = dict(Deployment.objects.filter(organization_id=organization_id, id__in=set(parsed.values()))
                 .values_list("id", "active_from"))
    return {raw: (str(value), found[value]) for raw, value in parsed.items() if value in found}


# The rows travel as one JSON text: json.dumps is C code, where binding five arrays element by
# element costs twice the client CPU (measured, benchmarks/metering_ingest.py).
_INSERT_PG = """
INSERT INTO metering_usageevent
    (organization_id, deployment_id, idempotency_key, occurred_at, gpu_hours, payload_sha256)
SELECT %s, u.d, u.k, u.t, u.h, u.p
FROM json_to_recordset(%s::json) AS u(d uuid, k text, t timestamptz, h numeric, p text)
ON CONFLICT (organization_id, idempotency_key) DO NOTHING
RETURNING idempotency_key
"""


def _insert(organization_id: int, rows: list[tuple[str, str, datetime, Decimal, str]]) -> set[str]:
    """Insert what is new; return the keys that were inserted (the others already existed)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(f"SET LOCAL statement_timeout = {STATEMENT_TIMEOUT_MS}; "
                           f"SET LOCAL idle_in_transaction_session_timeout = {STATEMENT_TIMEOUT_MS}")
            payload = json.dumps([{"d": deployment, "k": key, "t": moment.isoformat(), "h": str(hours), "p": digest}
                                  for deployment, key, moment, hours, digest in rows])
            cursor.execute(_INSERT_PG, [organization_id, payload])
        else:  # SQLite (the demo): the same statement as a VALUES list.
            values = ", ".join(["(%s, %s, %s, %s, %s, %s)"] * len(rows))
            params: list[Any] = []
            for deployment, key, moment, hours, digest in rows:
                params += [organization_id, deployment.replace("-", ""), key, moment.astimezone(UTC).isoformat(),
                           str(hours), digest]
            cursor.execute(
                "INSERT INTO metering_usageevent (organization_id, deployment_id, idempotency_key, occurred_at, "
                f"gpu_hours, payload_sha256) VALUES {values} ON CONFLICT (organization_id, idempotency_key) "
                "DO NOTHING RETURNING idempotency_key", params)
        return {row[0] for row in cursor.fetchall()}


def usage_ingest(*, organization_id: int, events: Sequence[Any], now: datetime | None = None) -> list[EventResult]:
    """Check and store a batch; one result per event, in order. Nothing is rejected as a whole
    except a batch that is not a list of at most MAX_EVENTS (the caller checks that)."""
    now = now or timezone.now()
    oldest, newest = now - MAX_AGE, now + MAX_AHEAD
    deployments = _deployments(organization_id, {
        event.get("deployment") for event in events
        if isinstance(event, dict) and isinstance(event.get("deployment"), str)})
    results: list[EventResult | None] = [None] * len(events)
    first_seen: dict[str, tuple[int, str]] = {}  # key -> (index, digest) of its first event in the batch
    rows: list[tuple[str, str, datetime, Decimal, str]] = []
    repeats: list[tuple[int, str, str]] = []
    for index, event in enumerate(events):
        key = event.get("idempotency_key") if isinstance(event, dict) else None
        key = key if isinstance(key, str) else None
        try:
            if not isinstance(event, dict):
                raise _Rejected(Rejection.INVALID_EVENT, "each event is an object {idempotency_key, deployment, "
                                                         "timestamp, gpu_hours}.")
            if key is None or not 0 < len(key) <= MAX_KEY_LENGTH or not key.isprintable():
                raise _Rejected(Rejection.INVALID_KEY, f"idempotency_key is a string of 1 to {MAX_KEY_LENGTH} "
                                                       "printable characters, unique per event you mean to count "
                                                       "once.")
            raw_deployment = event.get("deployment")
            found = deployments.get(raw_deployment) if isinstance(raw_deployment, str) else None
            if found is None:
                raise _Rejected(Rejection.DEPLOYMENT_NOT_FOUND,
                                f"deployment {str(event.get('deployment'))[:40]!r} is not one of your organization's "
                                "deployments; list them with GET /api/v1/deployments.")
            deployment, active_from = found
            moment = _timestamp(event.get("timestamp"), oldest=oldest, newest=newest)
            if moment < active_from:
                raise _Rejected(Rejection.BEFORE_DEPLOYMENT,
                                f"timestamp {event['timestamp']} is before the deployment went live "
                                f"({active_from.isoformat()}).")
            hours = _hours(event.get("gpu_hours"))
        except _Rejected as rejected:
            results[index] = EventResult(key, Status.REJECTED, rejected.code, rejected.message)
            continue
        digest = payload_digest(deployment=deployment, occurred_at=moment, gpu_hours=hours)
        if key in first_seen:
            repeats.append((index, key, digest))  # settled once its first event's fate is known
            continue
        first_seen[key] = (index, digest)
        rows.append((deployment, key, moment, hours, digest))
    if rows:
        with transaction.atomic():
            inserted = _insert(organization_id, rows)
            existing = {}
            if len(inserted) < len(rows):
                missing = [row[1] for row in rows if row[1] not in inserted]
                existing = dict(UsageEvent.objects.filter(organization_id=organization_id, idempotency_key__in=missing)
                                .values_list("idempotency_key", "payload_sha256"))
        for _, key, _, _, digest in rows:
            index = first_seen[key][0]
            if key in inserted:
                results[index] = EventResult(key, Status.CREATED)
            else:
                results[index] = _compare(key, stored=existing.get(key, ""), sent=digest)
    for index, key, digest in repeats:
        first_index, first_digest = first_seen[key]
        first = results[first_index]
        if digest == first_digest and first is not None and first.status is Status.REJECTED:
            results[index] = first
        else:
            results[index] = _compare(key, stored=first_digest, sent=digest)
    return results  # type: ignore[return-value]


def _compare(key: str, *, stored: str, sent: str) -> EventResult:
    if stored == sent:
        return EventResult(key, Status.DUPLICATE)
    return EventResult(key, Status.REJECTED, Rejection.IDEMPOTENCY_CONFLICT,
                       f"idempotency_key {key[:60]!r} was already used for a different event (deployment, timestamp "
                       "or gpu_hours differ); use a new key for a new event.")


def usage_summary(results: Sequence[EventResult]) -> dict[str, int]:
    counts = {status.value: 0 for status in Status}
    for result in results:
        counts[result.status.value] += 1
    return counts
