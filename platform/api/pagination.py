"""Cursor pagination of the API's lists: newest first by (created_at, id), `limit` rows a page
(default 50, at most 200) and an opaque `cursor` that the previous page answered as `next`.

A cursor is the position after the last row shown, not an offset, so rows written between two
requests never shift a page: every row is listed once, and a new one only before the first page.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Callable

from django.core.exceptions import ValidationError
from django.db.models import Model, Q, QuerySet
from django.http import HttpRequest

from api.auth import ApiError

DEFAULT_LIMIT = 50
MAX_LIMIT = 200


@dataclass(frozen=True)
class Page:
    rows: list[Any]
    next: str | None  # the cursor of the following page; None on the last


def page_of(request: HttpRequest, queryset: QuerySet, *, limit: int | None = None) -> Page:
    """One page of `queryset` (already filtered to what the actor may read), in the list order;
    `limit` rows, or the request's `limit`."""
    limit = limit or _limit(request.GET.get("limit"))
    ordered = queryset.order_by("-created_at", "-pk")
    cursor = request.GET.get("cursor")
    if cursor:
        at, pk = _decode(cursor, queryset.model)
        ordered = ordered.filter(Q(created_at__lt=at) | Q(created_at=at, pk__lt=pk))
    rows = list(ordered[:limit + 1])
    more = len(rows) > limit
    rows = rows[:limit]
    return Page(rows=rows, next=_encode(rows[-1]) if more else None)


def page_body(request: HttpRequest, queryset: QuerySet, key: str,
              serialize: Callable[[Any], dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """`{key: [serialize(row), ...], "next": cursor or null}` for one page of `queryset`."""
    page = page_of(request, queryset)
    return {key: [serialize(row) for row in page.rows], "next": page.next, **extra}


def _limit(raw: str | None) -> int:
    if raw in (None, ""):
        return DEFAULT_LIMIT
    try:
        limit = int(raw)
    except ValueError:
        limit = 0
    if not 1 <= limit <= MAX_LIMIT:
        raise ApiError(400, "invalid_limit", f"limit is a whole number from 1 to {MAX_LIMIT}; got {raw[:40]!r}.")
    return limit


def _encode(row: Model) -> str:
    position = json.dumps([row.created_at.isoformat(), str(row.pk)], separators=(",", ":"))
    return base64.urlsafe_b64encode(position.encode()).decode().rstrip("=")


def _decode(cursor: str, model: type[Model]) -> tuple[datetime, Any]:
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        at_text, pk_text = json.loads(text)
        at = datetime.fromisoformat(at_text)
        pk = model._meta.pk.to_python(pk_text)
        if at.tzinfo is None or pk is None:
            raise ValueError("incomplete position")
    except (binascii.Error, UnicodeDecodeError, ValueError, TypeError, ValidationError):
        raise ApiError(400, "invalid_cursor", "cursor is not one this list answered as `next`; start again "
                                              "without it.") from None
    return at, pk


@dataclass(frozen=True)
class HtmlPage:
    """A page of a list for a web page: its rows, the links to the newest and the next older page
    (None where there is none), and why a cursor was ignored (None if it was not)."""

    rows: list[Any]
    older: str | None
    newest: str | None
    problem: str | None = None


def html_page(request: HttpRequest, queryset: QuerySet, *, limit: int = 100) -> HtmlPage:
    """One page for a web list: `?cursor=` as the API's, other query parameters (filters) kept in
    the links; an unusable cursor shows the newest page and says so instead of failing."""
    problem = None
    try:
        page = page_of(request, queryset, limit=limit)
    except ApiError as exc:
        request.GET = request.GET.copy()
        request.GET.pop("cursor", None)
        page, problem = page_of(request, queryset, limit=limit), exc.message
    query = request.GET.copy()
    query.pop("cursor", None)
    newest = f"?{query.urlencode()}" if request.GET.get("cursor") else None
    older = None
    if page.next:
        query["cursor"] = page.next
        older = f"?{query.urlencode()}"
    return HtmlPage(rows=page.rows, older=older, newest=newest, problem=problem)

