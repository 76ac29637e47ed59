"""Limits that refuse a request for now: fixed-window counters in the database (an address's posts
to a public form, an organization's upload bytes in a day) and the errors a refusal raises.

The counters live in PostgreSQL, not in a per-process cache, so every web node counts together.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from django.db import connection
from django.utils import timezone

from accounts.models import WindowCounter
from api.errors import ApiError


class LimitReached(ApiError):
    """A request refused by a lock-out, a throttle or a quota; `message` says the limit and when or
    how to go on. 429 with `Retry-After` when time lifts it; 409 when only a change of state does
    (a run finishing), and then `retry_after` is None.

    An ApiError, so an endpoint under /api/ answers it with the JSON error contract; pages get it
    from dyno.guards (a 429 or 409 page)."""

    code = "limit_reached"

    def __init__(self, message: str, *, retry_after: int | None, status: int = 429) -> None:
        super().__init__(status, self.code, message)
        self.retry_after = None if retry_after is None else max(1, int(retry_after))


class SigninLocked(LimitReached):
    code = "signin_locked"


class Throttled(LimitReached):
    code = "throttled"


class QuotaExceeded(LimitReached):
    code = "quota_exceeded"


def wait_phrase(seconds: float, *, now: datetime | None = None) -> str:
    """'in 14 minutes (after 12:34 UTC)': when a refused request may be tried again."""
    seconds = max(1, math.ceil(seconds))
    at = (now or timezone.now()).astimezone(UTC) + timedelta(seconds=seconds)
    if seconds < 120:
        span = f"{seconds} seconds"
    elif seconds < 2 * 3600:
        span = f"{math.ceil(seconds / 60)} minutes"
    else:
        span = f"{seconds / 3600:.1f} hours"
    return f"in {span} (after {at:%H:%M:%S} UTC)"


def window_bounds(*, seconds: int, now: datetime | None = None) -> tuple[datetime, datetime]:
    """The fixed window holding `now`: windows of `seconds` aligned on the Unix epoch, so a
    86400-second window is a UTC day."""
    now = now or timezone.now()
    start_epoch = int(now.timestamp()) // seconds * seconds
    start = datetime.fromtimestamp(start_epoch, tz=UTC)
    return start, start + timedelta(seconds=seconds)


def window_take(*, key: str, amount: int, limit: int, seconds: int, now: datetime | None = None) -> float | None:
    """Add `amount` to `key`'s count in the current window unless that would pass `limit`.

    Returns None when taken, or the seconds until the window ends when refused (nothing is added
    then). One statement, so concurrent requests on every node count exactly: the conditional
    upsert adds only while the sum stays within the limit."""
    if amount <= 0:
        return None
    now = now or timezone.now()
    start, end = window_bounds(seconds=seconds, now=now)
    if amount > limit:
        return (end - now).total_seconds()
    table = connection.ops.quote_name(WindowCounter._meta.db_table)
    # PostgreSQL and SQLite (3.35+) both read this upsert; a refused update returns no row.
    sql = (f'INSERT INTO {table} ("key", "window_start", "expires_at", "count") VALUES (%s, %s, %s, %s) '
           f'ON CONFLICT ("key", "window_start") DO UPDATE SET "count" = {table}."count" + excluded."count" '
           f'WHERE {table}."count" + excluded."count" <= %s RETURNING "count"')
    with connection.cursor() as cursor:
        cursor.execute(sql, [key[:200], start, end, amount, limit])
        row = cursor.fetchone()
    if row is None:
        return (end - now).total_seconds()
    if row[0] == amount:
        # The first take of a new window: a cheap moment to drop the windows that have ended.
        WindowCounter.objects.filter(expires_at__lt=now).delete()
    return None


def window_used(*, key: str, seconds: int, now: datetime | None = None) -> int:
    """What `key` has counted so far in the current window."""
    start, _ = window_bounds(seconds=seconds, now=now)
    row = WindowCounter.objects.filter(key=key[:200], window_start=start).values_list("count", flat=True).first()
    return row or 0
