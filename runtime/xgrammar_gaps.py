"""What xgrammar enforces less strictly than a constraint says, found without importing it.

Two readers: the embedded engine's xgrammar backend refuses such a constraint (the chain moves
on to another backend), and the vLLM engine, whose server runs the same xgrammar (0.2.8) and
has no other backend to move on to, sends a relaxed constraint and checks the output after
(runtime/engines/vllm_gaps.py). Probed with this version: its JSON-schema converter accepts
and ignores the UNENFORCED keywords, drops others only in some combinations (it says so on
stderr and compiles anyway), reads some regex escapes as the letter or digit itself, and
compiles a string format it does not know as any string.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from runtime.regex_features import group_construct
from runtime.schema_keywords import CHECKED_FORMATS, IGNORED_BY_ALL_BUT_LLGUIDANCE
from runtime.schema_walk import integer_typed

# Keywords the converter accepts but does not enforce (probed in tests/runtime/test_backends.py).
UNENFORCED = IGNORED_BY_ALL_BUT_LLGUIDANCE | frozenset({"allOf", "patternProperties"})

# The string formats xgrammar enforces (the shape); it compiles any other as any string. The
# same list is vLLM's STRING_SUPPORTED_FORMATS: its xgrammar backend refuses a schema with
# any other format.
XGRAMMAR_FORMATS = frozenset(
    {
        "email",
        "date",
        "time",
        "date-time",
        "duration",
        "ipv4",
        "ipv6",
        "hostname",
        "uuid",
        "uri",
        "uri-reference",
        "uri-template",
        "json-pointer",
        "relative-json-pointer",
    }
)

LENGTHS = ("minLength", "maxLength")

# Escapes Python's `re` reads as anchors, octal or named characters (and the `regex` module
# and llguidance \p{..} as a Unicode property) and xgrammar's regex converter as the letter or
# digit itself ("Escape sequence '\Z' is not recognized. The character itself will be
# matched"); a \x escape followed by a third hex digit, which xgrammar reads into the escape
# (\x41B is U+041B to it, "AB" to Python); any other escape pair is skipped whole.
_ESCAPE = re.compile(r"\\(?:([AZzNpP]|0[0-7]|[1-9])|x([0-9a-fA-F]{2})(?=[0-9a-fA-F])|.)", re.DOTALL)

# Where xgrammar's C++ logged an error ("[08:44:51] /project/cpp/regex_converter.cc:83: "),
# which begins its messages and says nothing to a client (vLLM passes it on in its own).
LOG_LOCATION = re.compile(r"\[[0-9:]+\] \S+:\d+: ")

_RANGE = frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})


def xgrammar_misreading(pattern: str) -> str | None:
    """Why xgrammar would read this regex otherwise than Python, and how to write it so
    both read it alike; or None. Its converter reads some escapes as the character itself
    and a third hex digit into a \\x escape, and cannot parse a group's flags, name or
    comment (a 400 quoting its C++ source)."""
    for match in _ESCAPE.finditer(pattern):
        if match.group(1):
            return (
                f"reads the escape \\{match.group(1)} in {pattern!r} literally: write it as a"
                " character class or an anchor-free pattern (the regex is matched whole)"
            )
        if match.group(2):
            digits = match.group(2)
            return (
                f"reads \\x{digits} and the hex digit after it in {pattern!r} as one escape:"
                f" write \\u00{digits} instead"
            )
    construct = group_construct(pattern)
    if construct is not None:
        return (
            f"cannot read the group beginning {construct!r} in {pattern!r} (flags, a name or a"
            " comment): write it as (?:...), with cases or newlines spelled out"
        )
    return None


def weakened(node: dict[str, Any], pointer: str) -> Iterator[tuple[str, str]]:
    """(keyword, why) for each keyword of this schema node that xgrammar compiles and then
    enforces less than it says, beyond the UNENFORCED ones it ignores everywhere."""
    at = pointer or "/"
    if "multipleOf" in node and not integer_multiple(node):
        yield (
            "multipleOf",
            (
                f"ignores multipleOf at {at} (enforced on whole steps of integers with no minimum"
                " or maximum beside it)"
            ),
        )
    if {"pattern", "format"} & node.keys():
        for keyword in LENGTHS:
            if keyword in node:
                yield keyword, f"ignores minLength/maxLength beside a pattern or format at {at}"
    pattern = node.get("pattern")
    if isinstance(pattern, str):
        misread = xgrammar_misreading(pattern)
        if misread is not None:
            yield "pattern", f"{misread} at {at}"
    if node.get("format") in CHECKED_FORMATS - XGRAMMAR_FORMATS:
        yield "format", f"ignores format {node['format']!r} at {at} (reads it as any string)"


def integer_multiple(node: dict[str, Any]) -> bool:
    """Whether xgrammar enforces this node's multipleOf: a whole step on an integer with no
    range beside it ("range + multipleOf combination not yet supported")."""
    step = node["multipleOf"]
    return (
        integer_typed(node)
        and isinstance(step, int | float)
        and not isinstance(step, bool)
        and float(step).is_integer()
        and not _RANGE & node.keys()
    )
