"""Untrusted input read within bounds: JSON under a byte and a nesting cap, request sizes judged
from Content-Length before a body is read, and instants inside a sane window, in UTC.

Pure (no Django), so the API, uploads (config.json, safetensors headers), /verify and metering all
refuse a hostile document the same way: with an `InputRejected` that says what to change, never
with a RecursionError, an OverflowError or a body read into memory first.
"""

from __future__ import annotations

import json
import math
import re
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, date, datetime
from typing import Any

# Reports, configs, safetensors headers and API bodies nest under ten levels; anything near this is
# an attack or a bug. Far below the interpreter's recursion limit, so every later json.dumps of a
# parsed document (JSONField, audit log) is safe too.
MAX_DEPTH = 64

# Instants (and days) the platform accepts from outside. Wide enough for any real contract or usage
# event, narrow enough that converting to UTC or adding a month never leaves datetime's range and
# that PostgreSQL never stores a value every later page would fail to read.
EARLIEST = datetime(2000, 1, 1, tzinfo=UTC)
LATEST = datetime(2100, 1, 1, tzinfo=UTC)

_MAX_MOMENT_CHARS = 64  # the longest RFC 3339 text is 35 characters
_MAX_ID_CHARS = 64  # a UUID is 36 characters (45 with a "urn:uuid:" prefix)
_MAX_INT_DIGITS = 100  # a 64-bit integer has 20; far longer ones only cost quadratic parsing time
# A JSON string token, removed before brackets are counted: brackets inside strings are text. An
# unterminated string runs to the end (a parser stops there too), so every match attempt succeeds
# and the scan stays linear: retrying from each later quote would be quadratic on a quote followed
# by a megabyte of escaped quotes.
_STRING = re.compile(r'"[^"\\]*(?:\\(?:.|\Z)[^"\\]*)*(?:"|\Z)', re.S)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


class InputRejected(ValueError):
    """Input refused before it could do harm. `code`: "too_large", "too_deep", "invalid_json",
    "invalid_text", "invalid_time" or "invalid_id"; `message` says what was wrong and what to do, and never carries server detail."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message

    def __str__(self) -> str:
        return self.message


def nesting_depth(text: str, *, stop_above: int | None = None) -> int:
    """The deepest nesting of arrays and objects in JSON `text`, counted without recursion.

    Strings are removed first (brackets inside them are text); opens and closes are then counted
    whether or not they match, so for malformed text this bounds how deep a parser would recurse
    before it fails. Stops counting once `stop_above` is exceeded.
    """
    depth = deepest = 0
    for bracket in _NOT_BRACKET.sub("", _STRING.sub("", text)):
        if bracket in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if stop_above is not None and deepest > stop_above:
                    break
        else:
            depth -= 1
    return deepest


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _bounded_int(text: str) -> int:
    if len(text) > _MAX_INT_DIGITS:
        raise ValueError(f"a number has {len(text):,} digits, more than any real value needs")
    return int(text)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} is too large")
    return value


def json_loads_bounded(data: bytes | str, *, max_bytes: int, what: str, max_depth: int = MAX_DEPTH,
                       object_pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None = None,
                       refuse_nul: bool = True) -> Any:
    """Parse untrusted JSON (UTF-8 bytes or text) of at most `max_bytes` and `max_depth` levels.

    Strict RFC 8259: no NaN or Infinity, no number that overflows a float; no NUL character in a
    string unless `refuse_nul` is False (a caller that judges each item of a batch itself). `what`
    names the document in messages ("the request body", "config.json"). Raises InputRejected.
    """
    size = len(data) if isinstance(data, bytes) else len(data.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise InputRejected("too_large", f"{what} is {size:,} bytes; at most {max_bytes:,} are accepted.")
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InputRejected("invalid_json", f"{what} is not UTF-8 text (byte {exc.start:,} is not); "
                                                "save it as UTF-8 JSON.") from None
    else:
        text = data
    if nesting_depth(text, stop_above=max_depth) > max_depth:
        raise InputRejected("too_deep", f"{what} nests arrays or objects more than {max_depth} levels deep; "
                                        "flatten it.")
    try:
        document = json.loads(text, object_pairs_hook=object_pairs_hook, parse_constant=_refuse_constant,
                              parse_float=_finite_float, parse_int=_bounded_int)
    except json.JSONDecodeError as exc:
        raise InputRejected("invalid_json", f"{what} is not valid JSON: {exc.msg} at line {exc.lineno}, "
                                            f"column {exc.colno}; fix it there.") from None
    except ValueError as exc:  # raised by the hooks (ours and the caller's): their text names the value
        raise InputRejected("invalid_json", f"{what} is not acceptable JSON: {exc}; fix it.") from None
    # Only an escape can put a NUL in a string (the parser refuses raw control characters there).
    where = nul_path(document) if refuse_nul and "\\u0000" in text else None
    if where is not None:
        raise InputRejected("invalid_text", f"{what} holds a NUL character (\\u0000) at {where}, which Dyno "
                                            "cannot store; remove it.")
    return document


def nul_path(document: Any) -> str | None:
    """Where a parsed JSON document holds a NUL character (U+0000) in a key or a string, as a
    path ("$.workloads[2].name"), or None. PostgreSQL stores no NUL in text or jsonb: a string with
    one is refused at the door rather than failing the write."""
    stack: list[tuple[str, Any]] = [("$", document)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            if "\x00" in value:
                return path
        elif isinstance(value, dict):
            for key, item in value.items():
                if "\x00" in str(key):
                    return path
                stack.append((f"{path}.{str(key)[:40]}", item))
        elif isinstance(value, list):
            stack.extend((f"{path}[{index}]", item) for index, item in enumerate(value))
    return None


def json_object_bounded(data: bytes | str, *, max_bytes: int, what: str, **options: Any) -> dict[str, Any]:
    """`json_loads_bounded`, and the document must be an object."""
    document = json_loads_bounded(data, max_bytes=max_bytes, what=what, **options)
    if not isinstance(document, dict):
        raise InputRejected("invalid_json", f"{what} must be a JSON object ({{...}}).")
    return document


def content_length(meta: Mapping[str, Any]) -> int | None:
    """The Content-Length a request declares (from its WSGI environ / Django META), if it is a number.

    Django reads at most this many bytes of a body, so comparing it with a cap before touching
    `request.body`, `request.POST` or `request.FILES` bounds what the request can make us read.
    """
    try:
        value = int(meta.get("CONTENT_LENGTH") or "")
    except (TypeError, ValueError):
        return None
    return value if value >= 0 else None


def _window() -> str:
    return f"{EARLIEST:%Y-%m-%d} to {LATEST:%Y-%m-%d} (UTC)"


def moment_bounded(value: Any, *, what: str) -> datetime:
    """An RFC 3339 time with a timezone, converted to UTC, inside [EARLIEST, LATEST).

    The conversion runs inside the guard: "9999-12-31T23:59:59-01:00" parses but is past datetime's
    range in UTC, and is refused here like any other instant outside the window.
    """
    example = "e.g. 2026-11-03T14:00:00Z"
    if not isinstance(value, str) or not value.strip():
        raise InputRejected("invalid_time", f"{what} is an RFC 3339 time string with a timezone, {example}.")
    if len(value) > _MAX_MOMENT_CHARS:
        raise InputRejected("invalid_time", f"{what} is {len(value):,} characters long; an RFC 3339 time is "
                                            f"at most {_MAX_MOMENT_CHARS}, {example}.")
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise InputRejected("invalid_time", f"{what} {value!r} is not an RFC 3339 time; send {example}.") from None
    return instant_bounded(moment, what=f"{what} {value!r}")


def instant_bounded(moment: datetime, *, what: str) -> datetime:
    """An aware datetime converted to UTC inside [EARLIEST, LATEST), for services that take one
    from a caller rather than from text."""
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise InputRejected("invalid_time", f"{what} has no timezone; add Z or an offset like +00:00.")
    try:
        utc = moment.astimezone(UTC)
    except (OverflowError, ValueError):
        utc = None
    if utc is None or not EARLIEST <= utc < LATEST:
        raise InputRejected("invalid_time", f"{what} is outside the accepted window {_window()}; check the year.")
    return utc


def day_bounded(value: Any, *, what: str) -> date:
    """A calendar day written YYYY-MM-DD, inside the same window as `moment_bounded`."""
    example = "a date like 2026-12-01"
    if not isinstance(value, str) or len(value) > _MAX_MOMENT_CHARS:
        raise InputRejected("invalid_time", f"{what} is {example}.")
    try:
        day = date.fromisoformat(value)
    except ValueError:
        raise InputRejected("invalid_time", f"{what} is {example}; got {value!r}.") from None
    if not EARLIEST.date() <= day < LATEST.date():
        raise InputRejected("invalid_time", f"{what} {value!r} is outside the accepted window {_window()}; "
                                            "check the year.")
    return day


def id_bounded(value: Any, *, what: str) -> uuid.UUID:
    """An object's id as the API writes it (a UUID); anything else is refused with an example."""
    if isinstance(value, uuid.UUID):
        return value
    text = value if isinstance(value, str) else json.dumps(value, default=str)[:_MAX_ID_CHARS + 1]
    try:
        if len(text) > _MAX_ID_CHARS:
            raise ValueError
        return uuid.UUID(text)
    except ValueError:
        raise InputRejected("invalid_id", f"{what} must be an id like 0f8c2d1e-5b7a-4c1e-9a3b-2d4e6f8a0b1c; "
                                          f"got {text[:60]!r}.") from None
