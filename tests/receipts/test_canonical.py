"""canonical_json is byte-for-byte the rfc8785 reference, including where it takes its fast path."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
import rfc8785
from hypothesis import example, given, settings
from hypothesis import strategies as st

from receipts import canonical
from receipts.canonical import (
    canonical_json,
    canonical_plain,
    hash_json,
    loads_plain,
    sha256_hex,
)
from receipts.errors import CanonicalizationError

EDGE_FLOATS = [
    0.0,
    -0.0,
    1.0,
    -1.0,
    0.1,
    1e-4,
    9.999999e-5,
    1e-7,
    5e-324,
    1e16,
    9.99e15,
    1e21,
    1e20 + 1,
    2.0**53,
    2.0**53 + 2,
    -(2.0**53),
    1.7976931348623157e308,
    123456789.123,
    0.3333333333333333,
]
characters = st.characters(codec=None, categories=None)  # every code point, lone surrogates too
texts = st.one_of(
    st.text(characters, max_size=8),
    st.text(max_size=8),
    st.sampled_from(
        [
            "",
            "a",
            "\x00",
            "\x7f",
            "\u2028",
            "\ue000",
            "\U0001f600",
            "\ud800",
            "é",
            "\\",
            '"',
            "\x1f",
        ]
    ),
)
numbers = st.one_of(
    st.integers(min_value=-(2**53) - 2, max_value=2**53 + 2),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(EDGE_FLOATS),
)
scalars = st.one_of(st.none(), st.booleans(), numbers, texts)
json_values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=5),
        st.dictionaries(texts, children, max_size=5),
        st.tuples(children, children),
    ),
    max_leaves=30,
)


def _reference(value: Any) -> bytes | type[Exception]:
    try:
        return rfc8785.dumps(value)
    except (rfc8785.CanonicalizationError, UnicodeEncodeError):  # rfc8785: lone surrogate key
        return CanonicalizationError


@settings(max_examples=1200, deadline=None)
@given(json_values)
@example({"b": 1, "a": [0.7, 1.0, -0.0, 1e-7, 2**53 - 1]})
@example({"\ue000": 1, "\U0001f600": 2})  # code point vs UTF-16 order differ here
@example({"x": "\x00"})
@example({"k": 2**53})
def test_byte_equal_to_rfc8785(value: Any) -> None:
    want = _reference(value)
    if want is CanonicalizationError:
        with pytest.raises(CanonicalizationError):
            canonical_json(value)
    else:
        assert canonical_json(value) == want


@settings(max_examples=300, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False))
def test_every_finite_float_prints_like_ecmascript(value: float) -> None:
    assert canonical_json([value]) == rfc8785.dumps([value])


def test_hash_helpers() -> None:
    assert sha256_hex(b"abc") == hashlib.sha256(b"abc").hexdigest()
    assert hash_json({"b": [1, 2], "a": "x"}) == sha256_hex(b'{"a":"x","b":[1,2]}')
    with pytest.raises(CanonicalizationError):
        canonical_json({1: "non-string key"})
    with pytest.raises(CanonicalizationError):
        canonical_json(float("nan"))


@settings(max_examples=800, deadline=None)
@given(json_values, st.booleans())
@example({"a": [1.0, 0.7, 2**53 - 1, "x"]}, False)
def test_plain_route_is_byte_equal_when_taken(value: Any, ascii_only: bool) -> None:
    try:
        text = json.dumps(value, ensure_ascii=ascii_only).encode("utf-8")
    except (UnicodeEncodeError, ValueError):
        return  # a lone surrogate cannot be UTF-8 text at all
    parsed = loads_plain(text)
    if parsed is not None:
        assert canonical_plain(parsed) == rfc8785.dumps(json.loads(text))


def test_plain_route_is_taken_for_receipt_lines() -> None:
    line = canonical_json({"v": 1, "sampling": {"temperature": 0.7, "top_p": 1.0}, "n": 3})
    assert loads_plain(line) is not None
    assert loads_plain(b'{"k": "\\u00e9"}') is None
    assert loads_plain(b'{"k": 1e300}') is None


def test_a_value_nested_past_the_recursion_limit_is_refused_not_a_crash() -> None:
    """A bound schema nested ~1,000 levels parses but took rfc8785 past Python's recursion
    limit, a RecursionError that crashed `callproof verify`; the schema binding reports it."""
    from receipts.binding import SchemaBinding

    deep: dict[str, Any] = {}
    for _ in range(5_000):
        deep = {"a": deep}
    with pytest.raises(CanonicalizationError, match="nests too deep"):
        canonical_json(deep)
    bound = "ab" * 32
    manifest = {"schema_hash": bound}
    problem = SchemaBinding({bound: deep}).problem(
        manifest, {"tool_calls": []}, {"valid": True, "errors": []}
    )
    assert (
        problem
        == f"the stored schema {bound} is not canonical JSON: value nests too deep to canonicalize"
    )


def _plain_by_json_loads(text: bytes) -> Any | None:
    """loads_plain as it was before msgspec parsed it: json.loads with every number checked."""
    if not text.isascii() or b"\\u" in text:
        return None
    try:
        return json.loads(
            text,
            parse_float=canonical._plain_float,
            parse_int=canonical._plain_int,
            parse_constant=canonical._no_constant,
        )
    except (canonical._Unusual, ValueError, RecursionError):
        return None


@settings(max_examples=800, deadline=None)
@given(json_values)
@example([2**53 - 1, -(2**53 - 1), 2**53, 10**15, 10**16 - 1, 10**16])
@example({"h": "1234567890123456789", "n": 999999999999999})
@example([1.0, -0.0, 1e3, 1e16, 1e-5, 0.7])
def test_plain_route_reads_what_json_loads_reads(value: Any) -> None:
    """msgspec's route refuses and admits exactly what the json.loads route did, integers of
    16 digits or more (past 2**53 - 1 or not) included: it hands them to json.loads."""
    try:
        text = json.dumps(value).encode("ascii")
    except ValueError:
        return
    got, want = loads_plain(text), _plain_by_json_loads(text)
    assert got == want
    assert (got is None) == (want is None)


@pytest.mark.parametrize(
    ("text", "want"),
    [
        (b"[9007199254740991]", [9007199254740991]),
        (b"[9007199254740992]", None),
        (b"[999999999999999, 1.5e3]", [999999999999999, 1500]),
        (b'{"id": "0123456789012345678"}', {"id": "0123456789012345678"}),
        (b"[1e400]", None),
        (b"[NaN]", None),
        (b"[01]", None),
        (b"[1] x", None),
        (b"[" * 100_000 + b"]" * 100_000, None),
    ],
)
def test_plain_route_edges(text: bytes, want: Any) -> None:
    assert loads_plain(text) == want


@pytest.mark.parametrize("opening", [b"[", b'{"a":'])
def test_deep_nesting_is_read_as_json_loads_reads_it(opening: bytes) -> None:
    """msgspec nests a few levels deeper than json.loads (both limits move with the caller's
    stack): text that opens many arrays or objects goes through json.loads, so the two routes
    never disagree at any depth."""
    closing = b"]" if opening == b"[" else b"}"
    for depth in range(800, 1_001):
        text = opening * depth + b"1" + closing * depth
        assert loads_plain(text) == _plain_by_json_loads(text), depth


def test_a_string_spelled_like_a_float_placeholder_stays_a_string() -> None:
    """The fast path swaps floats for NUL-fenced placeholders; a string spelled like one must
    not be printed as the float (two values, one hash)."""
    value = {"a": 0.5, "b": "\x000\x00"}
    assert canonical_json(value) == rfc8785.dumps(value)
    assert canonical_json(value) != canonical_json({"a": 0.5, "b": 0.5})


@pytest.mark.parametrize(
    ("text", "plain"),
    [
        (b"[0.000005]", False),  # msgspec prints 5e-06, JCS 0.000005
        (b"[0.00000785766468193081]", False),
        (b"[0.00001]", False),
        (b"[1e-7]", False),
        (b"[1e+20]", False),  # past 2**53: JCS prints 100000000000000000000
        (b"[0.0001]", True),
        (b"[123.5, 1e15]", True),
    ],
)
def test_the_plain_route_takes_only_floats_it_prints_as_jcs(text: bytes, plain: bool) -> None:
    """Where msgspec and JCS print a float differently, loads_plain declines (the reference
    route then reads it), so a genuine bundle holding one is not refused."""
    value = loads_plain(text)
    assert (value is not None) == plain
    if value is not None:
        assert canonical_plain(value) == rfc8785.dumps(value)
