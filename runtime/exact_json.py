"""Exact JSON: the numbers a receipt can record without loss, and the parser that holds model
output and client schemas to them.

A receipt binds values in RFC 8785 canonical form, which holds I-JSON's exact numbers only
(RFC 7493 section 2.2): integers within +-(2**53 - 1), finite doubles, no NaN. A value past
that could be valid against its schema and still not be recorded faithfully, so it is
refused where the JSON is read rather than rounded in the receipt. So is a string holding a
lone surrogate (``"\\ud800"``: no UTF-8 form, I-JSON section 2.1), and an object naming
one key twice (I-JSON section 2.3): readers disagree on which value counts (Python's keeps
the last, others the first or refuse), so the receipt would record one value while the
agent, which gets the model's text, could act on the other.
"""

from __future__ import annotations

import json
import re
from typing import Any

from runtime.errors import StructuredOutputInvalid
from runtime.schema_walk import integer_typed, schema_nodes

# The same bound as receipts/canonical.py's MAX_SAFE_INT (tests/test_layout.py holds them equal).
MAX_EXACT_INTEGER = 2**53 - 1


class InexactNumber(ValueError):
    """A number in a JSON text that a receipt cannot hold exactly."""


def _exact_int(text: str) -> int:
    value = int(text)
    if abs(value) > MAX_EXACT_INTEGER:
        raise InexactNumber(f"the integer {text} is outside +-(2**53 - 1)")
    return value


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise InexactNumber(f"the number {text} overflows a double")
    return value


def _no_constant(name: str) -> None:
    raise InexactNumber(f"{name} is not JSON")


class DuplicateKey(ValueError):
    """An object in a JSON text that names one key twice."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    members = dict(pairs)
    if len(members) < len(pairs):
        seen: set[str] = set()
        twice = next(key for key, _ in pairs if key in seen or seen.add(key))
        raise DuplicateKey(f"an object names the key {twice!r} twice")
    return members


class LoneSurrogate(ValueError):
    """A string in a JSON text holding half of a UTF-16 surrogate pair."""


# a surrogate written as an escape, or (text decoded leniently) as itself
_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]|[\ud800-\udfff]")


def _utf8_strings(value: Any) -> None:
    """Raises LoneSurrogate at a string (or key) of ``value`` that has no UTF-8 form."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
            stack.extend(item)  # keys too
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str):
            try:
                item.encode()
            except UnicodeEncodeError:
                shown = repr(item) if len(item) <= 40 else repr(item[:40]) + "..."
                raise LoneSurrogate(f"the string {shown} holds a lone surrogate") from None


# json's decoder with the exact-number and unique-key rules; raises InexactNumber or
# DuplicateKey (ValueErrors) past them
EXACT_JSON = json.JSONDecoder(
    object_pairs_hook=_unique_keys,
    parse_int=_exact_int,
    parse_float=_finite_float,
    parse_constant=_no_constant,
)


def load_exact(text: str | bytes) -> Any:
    """``text`` decoded by :data:`EXACT_JSON`; raises InexactNumber past the exact-number rule,
    DuplicateKey past the unique-key one and LoneSurrogate at a string with no UTF-8 form
    (looked for only when the text spells a surrogate: a valid pair is two escapes)."""
    text = text.decode() if isinstance(text, bytes) else text
    value = EXACT_JSON.decode(text)
    if _SURROGATE.search(text):
        _utf8_strings(value)
    return value


def receipt_bounded_integers(schema: Any) -> Any:
    """``schema`` with +-MAX_EXACT_INTEGER as the minimum and maximum of each integer type
    that has no bound of its own on that side (a plain ``integer`` let a model write digits
    until max_tokens, for output a receipt cannot hold: a 422). A node with a ``multipleOf``
    is left alone: xgrammar ignores a step beside a range. For what a decoder compiles only;
    the schema a receipt binds, and the grammar cache's key, stay as the client wrote them.
    Modifies ``schema`` in place and returns it."""
    for _, node in schema_nodes(schema):
        if not integer_typed(node) or "multipleOf" in node:
            continue
        if not {"minimum", "exclusiveMinimum"} & node.keys():
            node["minimum"] = -MAX_EXACT_INTEGER
        if not {"maximum", "exclusiveMaximum"} & node.keys():
            node["maximum"] = MAX_EXACT_INTEGER
    return schema


def load_json(text: str, schema: dict[str, Any], *, param: str, pointer: str = "") -> Any:
    """``json.loads`` of model output whose failure is a StructuredOutputInvalid carrying the
    schema and naming ``param``, the request field that constrained it. Numbers a receipt
    cannot hold exactly (NaN, overflow, integers past 2**53) fail here too: the schema may
    allow them, the signed receipt could not record them; and so do a lone surrogate and a
    key named twice in one object, which the grammars let through."""
    try:
        return load_exact(text)
    except InexactNumber as exc:
        why = f"output holds a number a receipt cannot record exactly ({exc})"
    except DuplicateKey as exc:
        why = f"output is not one JSON value every reader agrees on ({exc})"
    except LoneSurrogate as exc:
        why = f"output holds a string a receipt cannot record ({exc}: it has no UTF-8 form)"
    except json.JSONDecodeError as exc:
        why = f"output is not valid JSON ({exc.msg}, char {exc.pos})"
    except RecursionError:
        why = "output is not JSON this gateway can read (nested too deep)"
    raise StructuredOutputInvalid(why, schema=schema, raw_output=text, pointer=pointer, param=param)


__all__ = [
    "EXACT_JSON",
    "MAX_EXACT_INTEGER",
    "DuplicateKey",
    "InexactNumber",
    "LoneSurrogate",
    "load_exact",
    "load_json",
]
