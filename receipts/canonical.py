"""RFC 8785 (JCS) canonical JSON and the SHA-256 helpers every hash in a receipt is built from.

One canonical byte string per JSON value is what makes a hash reproducible by an auditor in any
language. The `rfc8785` package is the reference; it is pure Python (about 80 us for a receipt),
so `canonical_json` takes a fast path through msgspec's C encoder (sorted keys) when that
provably prints the same bytes: sorting ASCII keys by code point equals JCS's UTF-16 order, and
both escape strings identically. Floats are the one type the encoders print differently, so
each is swapped for a placeholder and printed the ECMAScript way (by `rfc8785` itself outside
the range where Python's repr agrees). Anything else unusual (non-ASCII keys, tuples,
subclasses, out-of-range integers, NUL in strings) goes to `rfc8785` whole.
tests/receipts/test_canonical.py checks byte equality against `rfc8785` with hypothesis.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

import msgspec
import rfc8785

from receipts.errors import CanonicalizationError

MAX_SAFE_INT = 2**53 - 1
sorted_json = msgspec.json.Encoder(order="sorted").encode
"""Compact JSON, keys sorted by code point, UTF-8 bytes at C speed: the fast path's printer,
and lossless (not canonical) for any value canonical_json accepts."""
_PLACEHOLDER = re.compile(rb'"\\u0000(\d+)\\u0000"')


class _Unusual(Exception):
    """The value needs the reference encoder."""


def _prepare(value: Any, floats: list[float]) -> Any:
    """`value` with floats replaced by placeholders (the same object when it holds none);
    raises _Unusual for anything the fast path must not print."""
    kind = type(value)
    if kind is str:
        if "\x00" in value:  # keeps placeholders unambiguous
            raise _Unusual
        return value
    if kind is dict:
        changed = None
        for key, item in value.items():
            if type(key) is not str or not key.isascii() or "\x00" in key:
                raise _Unusual
            new = _prepare(item, floats)
            if new is not item:
                changed = changed or dict(value)
                changed[key] = new
        return value if changed is None else changed
    if kind is list:
        items = [_prepare(item, floats) for item in value]
        return value if all(a is b for a, b in zip(items, value, strict=True)) else items
    if kind is int:
        if not -MAX_SAFE_INT <= value <= MAX_SAFE_INT:
            raise _Unusual
        return value
    if kind is float:
        floats.append(value)
        return f"\x00{len(floats) - 1}\x00"
    if value is None or kind is bool:
        return value
    raise _Unusual


def _reference(obj: Any) -> bytes:
    try:
        return rfc8785.dumps(obj)
    except (rfc8785.CanonicalizationError, UnicodeEncodeError) as exc:  # lone surrogate key
        raise CanonicalizationError(f"value has no RFC 8785 canonical form: {exc}") from exc
    except RecursionError:  # rfc8785 recurses per level; a hostile schema can nest ~1,000
        raise CanonicalizationError("value nests too deep to canonicalize") from None


def canonical_json(obj: Any) -> bytes:
    """The RFC 8785 canonical UTF-8 bytes of a JSON value (dict keys must be strings).

    Raises CanonicalizationError for values JCS cannot represent exactly: NaN, infinities,
    integers outside +-(2**53 - 1), lone surrogates and non-JSON types.
    """
    floats: list[float] = []
    try:
        data = sorted_json(_prepare(obj, floats))
    except (_Unusual, UnicodeEncodeError, RecursionError):  # Unicode: a lone surrogate
        return _reference(obj)
    if not floats:
        return data
    texts = [_float_text(f).encode("ascii") for f in floats]
    return _PLACEHOLDER.sub(lambda m: texts[int(m.group(1))], data)


def _float_text(value: float) -> str:
    """ECMAScript Number-to-string of a double, which JCS prescribes. Where the shortest
    round-trip digits are printed without an exponent by both Python and ECMAScript
    (1e-4 <= |x| < 1e16) and for integral values, Python's repr gives the same text."""
    if value.is_integer():
        if abs(value) <= MAX_SAFE_INT:
            return str(int(value))
    elif 1e-4 <= abs(value) < 1e16:
        return repr(value)
    return _reference(value).decode("ascii")


def _plain_float(text: str) -> float | int:
    value = float(text)
    if value.is_integer():
        if abs(value) <= MAX_SAFE_INT:
            return int(value)  # JCS prints an integral double as an integer anyway
    elif 1e-4 <= abs(value) < 1e16:
        return value  # repr() prints it as ECMAScript does
    raise _Unusual


def _plain_int(text: str) -> int:
    value = int(text)
    if not -MAX_SAFE_INT <= value <= MAX_SAFE_INT:
        raise _Unusual
    return value


def _no_constant(text: str) -> Any:
    raise _Unusual  # NaN, Infinity


def loads_plain(text: bytes) -> Any | None:
    """Parse JSON text whose value the fast encoder prints exactly as RFC 8785 does, or None.

    The cheap route for a verifier or an export reading JSON lines: ASCII text without \\u
    escapes has no key-order or surrogate subtleties, and numbers are admitted only where Python
    prints them the ECMAScript way (integral floats come back as ints, the same JSON number).
    Encode the result, or any part of it, with `canonical_plain`.
    """
    if not text.isascii() or b"\\u" in text:
        return None
    try:
        if (
            _SIXTEEN_DIGITS not in text.translate(_DIGITS_AS_ZERO)  # no integer past 2**53 - 1
            and text.count(b"[") + text.count(b"{") < _NESTING  # nor msgspec's deeper limit
        ):
            return _plain_decoder.decode(text)
        return json.loads(
            text, parse_float=_plain_float, parse_int=_plain_int, parse_constant=_no_constant
        )
    except (_Unusual, ValueError, RecursionError, msgspec.DecodeError):
        return None


_plain_decoder = msgspec.json.Decoder(float_hook=_plain_float)
"""msgspec's C parser (about three times json.loads' speed on a receipt line); it calls the
hook only for numbers with a fraction or exponent, so integers are checked apart, by length."""
_DIGITS_AS_ZERO = bytes(0x30 if 0x30 <= b <= 0x39 else 0x20 for b in range(256))
_SIXTEEN_DIGITS = b"0" * 16  # 15 digits stay below 2**53 - 1 = 9007199254740991
_NESTING = 512  # below where json.loads (about 990 levels) and msgspec (997) give up


def canonical_plain(value: Any) -> bytes:
    """canonical_json of (part of) a value loads_plain returned, without the safety walk."""
    return sorted_json(value)


def sha256_hex(data: bytes) -> str:
    """Lowercase hex SHA-256 of raw bytes."""
    return hashlib.sha256(data).hexdigest()


def hash_json(obj: Any) -> str:
    """Lowercase hex SHA-256 of the canonical JSON of `obj` (schema, manifest, entry hashes)."""
    return hashlib.sha256(canonical_json(obj)).hexdigest()
