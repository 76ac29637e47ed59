"""Tests for proof/canonical.py: the exact bytes a report signature covers."""

from __future__ import annotations

import enum
import hashlib
import json
import math
import uuid
from datetime import UTC, datetime
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proof.canonical import MAX_DEPTH, CanonicalError, canonical_bytes


def test_it_sorts_keys_and_writes_no_whitespace() -> None:
    assert canonical_bytes({"b": 1, "a": 2, "c": {"z": None, "y": True}}) == (
        b'{"a":2,"b":1,"c":{"y":true,"z":null}}'
    )


def test_it_gives_the_same_bytes_whatever_the_insertion_order() -> None:
    first = {"x": 1, "y": [1, 2], "nested": {"p": "q", "o": [{"k": 1, "j": 2}]}}
    second = {"nested": {"o": [{"j": 2, "k": 1}], "p": "q"}, "y": [1, 2], "x": 1}
    assert canonical_bytes(first) == canonical_bytes(second)


def test_it_keeps_array_order_and_writes_tuples_as_arrays() -> None:
    assert canonical_bytes([3, 1, 2]) == b"[3,1,2]"
    assert canonical_bytes((3, 1, 2)) == b"[3,1,2]"
    assert canonical_bytes({"a": [[], {}, [{}]]}) == b'{"a":[[],{},[{}]]}'


def test_it_sorts_keys_by_code_point() -> None:
    # Upper case (U+0041..) sorts before lower case (U+0061..), which sorts before U+00E9.
    assert canonical_bytes({"é": 1, "b": 2, "B": 3, "a": 4}) == (
        '{"B":3,"a":4,"b":2,"é":1}'.encode()
    )


def test_it_writes_non_ascii_as_raw_utf8() -> None:
    assert canonical_bytes("Grüße 東京 🚀") == '"Grüße 東京 🚀"'.encode()
    assert b"\\u" not in canonical_bytes({"ключ": "значение"})


def test_it_normalizes_combining_characters_to_nfc() -> None:
    decomposed = "Cafe\u0301"  # "e" followed by COMBINING ACUTE ACCENT
    precomposed = "Caf\u00e9"
    assert canonical_bytes(decomposed) == canonical_bytes(precomposed) == b'"Caf\xc3\xa9"'
    assert canonical_bytes({decomposed: 1}) == canonical_bytes({precomposed: 1})


def test_it_refuses_keys_that_collide_after_normalization() -> None:
    with pytest.raises(CanonicalError, match="equal after NFC"):
        canonical_bytes({"Cafe\u0301": 1, "Caf\u00e9": 2})


def test_it_escapes_only_quotes_backslashes_and_control_characters() -> None:
    assert canonical_bytes('a"b\\c\nd\te\x00f\x1f') == b'"a\\"b\\\\c\\nd\\te\\u0000f\\u001f"'
    # DEL and LINE SEPARATOR are not JSON control characters: written raw.
    assert canonical_bytes("\x7f\u2028") == "\"\x7f\u2028\"".encode()


def test_it_refuses_lone_surrogates() -> None:
    with pytest.raises(CanonicalError, match=r"\$\.text: .*lone surrogate"):
        canonical_bytes({"text": "ok \ud800"})


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1.0, b"1.0"),
        (0.1, b"0.1"),
        (1e-7, b"1e-07"),
        (1e16, b"1e+16"),
        (123456.789, b"123456.789"),
        (-2.5, b"-2.5"),
        (5e-324, b"5e-324"),
        (0.0, b"0.0"),
        (-0.0, b"0.0"),
    ],
)
def test_it_writes_floats_with_the_shortest_round_trip_repr(value: float, expected: bytes) -> None:
    assert canonical_bytes(value) == expected


def test_it_keeps_integers_as_integers_of_any_size() -> None:
    assert canonical_bytes([0, -7, 2**53 + 1, 10**30, -(2**64)]) == (
        b"[0,-7,9007199254740993,1000000000000000000000000000000,-18446744073709551616]"
    )
    # A float stays a float so the reader gets the type back.
    assert canonical_bytes([1, 1.0]) == b"[1,1.0]"


def test_it_writes_booleans_and_null() -> None:
    assert canonical_bytes([True, False, None]) == b"[true,false,null]"


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_it_refuses_non_finite_floats(value: float) -> None:
    with pytest.raises(CanonicalError, match=r"\$\.samples\[1\]: float .* has no JSON form"):
        canonical_bytes({"samples": [1.0, value]})


def test_it_refuses_decimal_and_says_to_pass_a_string() -> None:
    with pytest.raises(CanonicalError, match=r"\$\.fee: Decimal .*as a string"):
        canonical_bytes({"fee": Decimal("1.10")})


@pytest.mark.parametrize("key", [1, 1.5, None, True, ("a", "b")])
def test_it_refuses_non_string_keys(key: object) -> None:
    with pytest.raises(CanonicalError, match="keys must be str"):
        canonical_bytes({"outer": {key: 1}})


class _Verdict(enum.Enum):
    ACCEPTED = "accepted"


class _Count(enum.IntEnum):
    ONE = 1


@pytest.mark.parametrize(
    ("value", "advice"),
    [
        (datetime(2025, 1, 1, tzinfo=UTC), "isoformat"),
        (b"raw", "base64"),
        ({1, 2}, "sorted list"),
        (uuid.UUID(int=1), "str"),
        (_Verdict.ACCEPTED, "convert it"),
        (_Count.ONE, "value"),
        (object(), "convert it"),
    ],
)
def test_it_refuses_other_types_with_advice(value: object, advice: str) -> None:
    with pytest.raises(CanonicalError, match=advice):
        canonical_bytes([value])


def test_it_refuses_absurd_nesting_with_a_clear_error() -> None:
    deep: list[object] = []
    for _ in range(MAX_DEPTH + 5):
        deep = [deep]
    with pytest.raises(CanonicalError, match="nested deeper"):
        canonical_bytes(deep)


def test_it_refuses_integers_too_long_to_print() -> None:
    with pytest.raises(CanonicalError, match="pass it as a string"):
        canonical_bytes(10**5000)


def test_it_matches_the_pinned_golden_bytes() -> None:
    # If this fails, canonical bytes changed on this platform or Python version, and every
    # signature made before no longer matches a re-serialization: find out why before shipping.
    report = {
        "schema": "dyno.suite-result/1",
        "suite": {"version": "v1", "profile": "cpu-ci", "manifest_sha256": "ab" * 32},
        "workloads": [
            {
                "name": "rmsnorm",
                "shape": [7, 4096],
                "dtype": "bfloat16",
                "speedup": 1.2345678901234567,
                "ci95": [1.1, 1.3],
                "samples_s": [1e-07, 2.5e-05, 0.001, 3.0],
                "verdict": "accepted",
                "reasons": [],
            }
        ],
        "summary": {"geomean_speedup": 1.0, "accepted": 1, "rejected": 0, "errors": 0},
        # Escapes keep the test's own source free of editor normalization.
        "notes": (
            "Mesure r\u00e9alis\u00e9e \u00e0 Z\u00fcrich \u2014 \u6771\u4eac, "
            'Cafe\u0301, "quoted"\n'
        ),
        "big": 2**70,
        "zero": -0.0,
        "flags": [True, False, None],
    }
    body = canonical_bytes(report)
    assert body.startswith(b'{"big":1180591620717411303424,"flags":[true,false,null],"notes":')
    assert hashlib.sha256(body).hexdigest() == (
        "8395206b269091e840ff9f310cf7aee912fbcd1dc1fde8a744135b3e197035f3"
    )


_json_leaf = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
_json_value = st.recursive(
    _json_leaf,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=150, deadline=None)
@given(_json_value)
def test_it_is_a_fixed_point_after_parsing_its_own_output(value: object) -> None:
    try:
        body = canonical_bytes(value)
    except CanonicalError as error:
        # Only two legitimate refusals for JSON-shaped data: lone surrogates and NFC collisions.
        assert "surrogate" in str(error) or "equal after NFC" in str(error)
        return
    assert canonical_bytes(json.loads(body)) == body
    body.decode("utf-8")  # always valid UTF-8
    assert b"\n" not in body
