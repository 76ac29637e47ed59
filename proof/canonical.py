"""Canonical JSON: the one byte string a report body stands for, on every run and platform.
Owns the serialization rules that a report signature (proof/signature.py) covers.

Rules (a change to any of them changes signed bytes, so it needs a new schema version):

1. Output is UTF-8 without a BOM, with no whitespace between tokens and no trailing newline.
2. Objects: keys must be `str`. Keys are NFC-normalized (rule 3) and sorted by Unicode code
   point (Python's `str` order; note this is not RFC 8785's UTF-16 order). Two keys that become
   equal after normalization are refused, since one would silently overwrite the other.
3. Strings (keys and values) are normalized to Unicode NFC, so "e" + U+0301 and the precomposed
   U+00E9 give the same bytes. Non-ASCII characters are written as raw UTF-8, never as \\u
   escapes. The only escapes are those of Python's `json` module: `\\"`, `\\\\`, the short forms
   `\\b \\f \\n \\r \\t`, and `\\u00xx` (lowercase hex) for the other C0 control characters.
   Lone surrogates cannot be encoded as UTF-8 and are refused.
4. `bool` is `true`/`false`; `None` is `null`; `list` and `tuple` are arrays, order kept.
5. `int` is written as its decimal digits, any size up to Python's int-to-str digit limit
   (4300 digits by default). JSON readers in other languages may lose precision beyond 2**53,
   but a verifier checks the bytes, not a re-serialization, so the signature still holds.
6. `float`: only finite values (NaN and +-Inf are refused). Written with Python's shortest
   round-trip repr (`repr(1.0) == "1.0"`, `repr(0.1) == "0.1"`, `repr(1e-07) == "1e-07"`,
   `repr(1e16) == "1e+16"`), which is the same on every IEEE-754 platform. A float stays a
   float (1.0 is never written as 1), so a reader gets the type back. -0.0 is written as 0.0:
   the sign of zero carries no meaning in a report and would otherwise give two byte strings
   for one value.
7. Nothing else is accepted, including subclasses of the scalar types (enums, `Decimal`,
   `datetime`, `bytes`, sets): the caller chooses their text form, so it is explicit and stable.
   Containers may be subclasses of `dict`, `list` or `tuple` (their content is what is written).
   Nesting deeper than MAX_DEPTH is refused rather than hitting the interpreter's recursion limit.
"""

from __future__ import annotations

import json
import math
import unicodedata
from typing import Any

# Reports nest about six levels; anything near this is a bug, not a report.
MAX_DEPTH = 64

NORMALIZATION_FORM = "NFC"

_SCALAR_TYPES = (str, int, float, bool, type(None))

# Advice for types people commonly put in reports; the value is what to do instead.
_CONVERSION_ADVICE = {
    "Decimal": "pass it as a string, e.g. str(amount), so no digits are lost or invented",
    "datetime": "pass it as an ISO 8601 string, e.g. value.isoformat()",
    "date": "pass it as an ISO 8601 string, e.g. value.isoformat()",
    "bytes": "pass it as a base64 or hex string",
    "bytearray": "pass it as a base64 or hex string",
    "set": "pass it as a sorted list",
    "frozenset": "pass it as a sorted list",
    "UUID": "pass it as a string, e.g. str(value)",
    "PosixPath": "pass it as a string, e.g. str(value)",
    "WindowsPath": "pass it as a string, e.g. str(value)",
}


class CanonicalError(ValueError):
    """The object cannot be written as canonical JSON; the message names where and why."""


def canonical_bytes(obj: Any) -> bytes:
    """The canonical JSON encoding of `obj` (rules in the module docstring)."""
    normalized = _normalize(obj, "$", 0)
    text = json.dumps(
        normalized,
        ensure_ascii=False,
        allow_nan=False,
        sort_keys=True,
        separators=(",", ":"),
    )
    return text.encode("utf-8")


def _normalize(value: Any, path: str, depth: int) -> Any:
    """A plain copy of `value` with the rules applied; raises CanonicalError where they can't be."""
    if depth > MAX_DEPTH:
        raise CanonicalError(
            f"{path}: nested deeper than {MAX_DEPTH} levels; flatten the structure"
        )
    if isinstance(value, dict):
        return _normalize_object(value, path, depth)
    if isinstance(value, (list, tuple)):
        return [_normalize(item, f"{path}[{index}]", depth + 1) for index, item in enumerate(value)]
    kind = type(value)
    if kind not in _SCALAR_TYPES:
        raise CanonicalError(_refusal(value, path))
    if kind is str:
        return _normalize_str(value, path)
    if kind is float:
        if not math.isfinite(value):
            raise CanonicalError(
                f"{path}: float {value!r} has no JSON form; report it as null or as a string"
            )
        # -0.0 == 0.0, so this maps only the negative zero.
        return 0.0 if value == 0.0 else value
    if kind is int:
        _check_int_fits(value, path)
    return value


def _normalize_object(value: dict[Any, Any], path: str, depth: int) -> dict[str, Any]:
    result: dict[str, Any] = {}
    original_keys: dict[str, str] = {}
    for key, item in value.items():
        if type(key) is not str:
            raise CanonicalError(
                f"{path}: object key {key!r} is a {type(key).__name__}; canonical JSON keys must "
                "be str (convert it explicitly, e.g. str(key))"
            )
        normal_key = _normalize_str(key, f"{path} key {key!r}")
        if normal_key in result:
            raise CanonicalError(
                f"{path}: keys {original_keys[normal_key]!r} and {key!r} are equal after "
                f"{NORMALIZATION_FORM} normalization; rename one of them"
            )
        original_keys[normal_key] = key
        result[normal_key] = _normalize(item, f"{path}.{normal_key}", depth + 1)
    return result


def _normalize_str(value: str, path: str) -> str:
    normal = unicodedata.normalize(NORMALIZATION_FORM, value)
    try:
        normal.encode("utf-8")
    except UnicodeEncodeError as error:
        raise CanonicalError(
            f"{path}: string has a lone surrogate at index {error.start} and cannot be UTF-8; "
            "decode the source text with errors='replace' or fix it upstream"
        ) from None
    return normal


def _check_int_fits(value: int, path: str) -> None:
    try:
        str(value)
    except ValueError:
        raise CanonicalError(
            f"{path}: integer has more digits than Python will convert to text; "
            "pass it as a string"
        ) from None


def _refusal(value: Any, path: str) -> str:
    type_name = type(value).__name__
    advice = _CONVERSION_ADVICE.get(type_name)
    if advice is None and isinstance(value, _SCALAR_TYPES):
        advice = "convert it to the plain type first (e.g. an enum member's .value)"
    if advice is None:
        advice = "convert it to str, int, float, bool, None, list or dict first"
    return f"{path}: {type_name} is not accepted in canonical JSON; {advice}"
