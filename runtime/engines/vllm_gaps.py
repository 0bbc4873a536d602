"""What the vLLM server's structured-output backend cannot enforce, found before the request
is sent, and the constraint sent in its place.

The embedded engine tries another grammar backend when one cannot enforce a schema, and
falls back to decoding then validating (post hoc) when none can. A vLLM server has one
backend, which either answers 400 without saying which keyword at which place (xgrammar:
"The provided JSON schema contains features not supported by xgrammar."; guidance:
"Grammar error: ...") or accepts the keyword and ignores it. So for a JSON schema this module
drops each keyword the server's backend would refuse or ignore, and the engine sends the
rest: the server enforces all it can, and the output is checked against the whole schema
after decoding (runtime.planning's validation, as for every output), which fails closed with
a 422 naming the JSON pointer. The generation records that path (``post_hoc_check:`` and the
keywords) in the receipt. A regex has no post-hoc path on either engine: one xgrammar would
read differently is refused here (400 ``constraint_unsupported``), naming the escape.

What vLLM 0.32's xgrammar backend refuses (vllm/v1/structured_output/backend_xgrammar.py:
``has_xgrammar_unsupported_json_features``): ``multipleOf`` on an integer or number (even the
whole integer steps xgrammar itself enforces), ``uniqueItems``/``contains``/``minContains``/
``maxContains`` on an array, a string ``format`` outside XGRAMMAR_FORMATS, ``minLength``/
``maxLength`` beside a ``pattern`` or ``format``, ``propertyNames`` and ``patternProperties``
beside other object keywords, an ``allOf`` of two or more parts; \\p escapes in a regex. What
xgrammar ignores is runtime.xgrammar_gaps's (the same xgrammar version, 0.2.8); a
``oneOf`` whose branches may overlap it reads as ``anyOf``, so that one is sent as it is and
only checked after. The guidance backend runs llguidance, which refuses the keywords the
other libraries ignore (IGNORED_BY_ALL_BUT_LLGUIDANCE) with a 400 that does not say where.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from runtime.bounded_cache import size_bounded
from runtime.constraint import Constraint
from runtime.errors import BackendCannotCompile
from runtime.schema_keywords import (
    IGNORED_BY_ALL_BUT_LLGUIDANCE,
    LLGUIDANCE_FORMATS,
    one_of_overlaps,
)
from runtime.schema_walk import schema_nodes
from runtime.xgrammar_gaps import UNENFORCED, XGRAMMAR_FORMATS, weakened, xgrammar_misreading

# Keywords the server refuses more widely than xgrammar weakens them (every multipleOf, every
# format outside XGRAMMAR_FORMATS): reported once each, as refused, not as weakened.
_REFUSED_BY_VLLM = ("multipleOf", "format")


@dataclass(frozen=True)
class Gap:
    """One keyword, at one schema node, that the server's backend would not enforce."""

    pointer: str  # of the schema node ("" the root)
    keyword: str
    why: str


@dataclass(frozen=True)
class Served:
    """The constraint to send, and what it leaves to the check after decoding."""

    constraint: Constraint | None
    gaps: tuple[Gap, ...] = ()

    @property
    def fallback(self) -> str | None:
        """What the receipt records as the path taken: None when the server enforces all."""
        if not self.gaps:
            return None
        return "post_hoc_check:" + ",".join(sorted({gap.keyword for gap in self.gaps}))


@size_bounded(
    lambda constraint, backend: len(constraint.source), max_entries=512, max_bytes=16 << 20
)
def served_constraint(constraint: Constraint, backend: str) -> Served:
    """``constraint`` as a server with structured-output ``backend`` ("xgrammar" or
    "guidance") can enforce it; BackendCannotCompile for a regex it would read differently."""
    if constraint.kind == "regex" and backend == "xgrammar":
        why = xgrammar_misreading(constraint.source)
        if why is not None:
            raise BackendCannotCompile(
                f"the vLLM server's xgrammar backend {why} (or serve with the guidance backend)",
                param=constraint.param,
            )
    if not constraint.is_json:
        return Served(constraint)
    schema = constraint.schema()  # a fresh copy: the gaps are dropped from it in place
    gaps: list[Gap] = []
    rewritten = False  # changed where nothing is lost: no gap to record
    for pointer, node in schema_nodes(schema):
        # dropped before the walk descends, so nothing below a dropped keyword is reported
        for keyword, why in _gaps(schema, node, pointer, backend):
            gaps.append(Gap(pointer, keyword, why))
            if keyword == "oneOf" and backend != "xgrammar":  # (xgrammar reads it as anyOf)
                _as_any_of(node)
            elif keyword != "oneOf":
                node.pop(keyword, None)
            if keyword == "patternProperties":
                # additionalProperties reads "keys no pattern matches", and xgrammar reads a
                # missing one as false: either way, without the patterns the object would be
                # closed to the keys they allow ({} alone, or a 400 with minProperties)
                node["additionalProperties"] = True
        if backend == "xgrammar":
            rewritten |= _as_xgrammar_reads_it(node, pointer, gaps)
    if not gaps and not rewritten:
        return Served(constraint)
    return Served(Constraint.json_schema(schema, kind=constraint.kind), tuple(gaps))


def _as_any_of(node: dict[str, Any]) -> None:
    """The node's oneOf sent as an anyOf: the same branches, held to one or more of them
    (the check after decoding holds the output to exactly one)."""
    branches = node.pop("oneOf")
    if "anyOf" in node:
        node["allOf"] = [*node.get("allOf", []), {"anyOf": branches}]
    else:
        node["anyOf"] = branches


def _as_xgrammar_reads_it(node: dict[str, Any], pointer: str, gaps: list[Gap]) -> bool:
    """Rewrite ``node`` in place where vLLM's xgrammar backend would refuse or misread what
    it says; a value left to the check after decoding joins ``gaps``. Whether anything else
    changed (an annotation left out, a required key listed)."""
    rewritten = False
    for keyword in _ANNOTATIONS:  # nothing enforces one: left out, nothing to check
        if keyword in node and _read_as_refused(node[keyword]):
            del node[keyword]
            rewritten = True
    for keyword in _DATA:
        if keyword in node and _read_as_refused(node[keyword]):
            gaps.append(Gap(pointer, keyword, _READ_AS_SCHEMA))
            del node[keyword]
    # xgrammar leaves out a required key its properties do not list (only {} was written):
    # listed, with the schema any other key's value must hold
    required, properties = node.get("required"), node.get("properties", {})
    extra = node.get("additionalProperties", True)
    if isinstance(required, list) and isinstance(properties, dict) and extra is not False:
        missing = [k for k in required if isinstance(k, str) and k not in properties]
        if missing:
            value = extra if isinstance(extra, dict) else {}
            node["properties"] = {**properties, **{key: value for key in missing}}
            rewritten = True
    return rewritten


# vLLM's feature check (has_xgrammar_unsupported_json_features) reads every object inside a
# schema as a schema, values included: an example, a default, a const or an enum member that
# looks like a refused one ({"type": "integer", "multipleOf": 3}) made the server refuse the
# request. Annotations are left out (xgrammar ignores them); a const or enum is checked after.
_ANNOTATIONS = ("default", "examples")
_DATA = ("const", "enum")
_READ_AS_SCHEMA = "a value the server's xgrammar check reads as a schema it refuses"


def _read_as_refused(value: Any) -> bool:
    """Whether vLLM's feature check finds a refused schema anywhere in ``value``."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, list):
            pending.extend(item)
            continue
        if not isinstance(item, dict):
            continue
        kind = item.get("type")
        if (
            (kind in ("integer", "number") and "multipleOf" in item)
            or (kind == "array" and _ARRAY_REFUSED & item.keys())
            or (kind == "string" and "format" in item and item["format"] not in XGRAMMAR_FORMATS)
            or (kind == "object" and _OBJECT_REFUSED & item.keys())
        ):
            return True
        pending.extend(item.values())
    return False


_ARRAY_REFUSED = frozenset({"uniqueItems", "contains", "minContains", "maxContains"})
_OBJECT_REFUSED = frozenset({"patternProperties", "propertyNames"})


def _gaps(
    root: dict[str, Any], node: dict[str, Any], pointer: str, backend: str
) -> Iterator[tuple[str, str]]:
    if backend != "xgrammar":  # guidance: llguidance refuses these itself
        for keyword in sorted(node.keys() & IGNORED_BY_ALL_BUT_LLGUIDANCE):
            yield keyword, "refused by the server's guidance backend"
        if "format" in node and node["format"] not in LLGUIDANCE_FORMATS:
            yield "format", "a format the server's guidance backend does not know"
        if one_of_overlaps(root, node):  # what it cannot prove disjoint, it refuses
            yield "oneOf", "refused by the server's guidance backend: its branches may overlap"
        return
    for keyword in sorted(node.keys() & UNENFORCED):
        yield keyword, "ignored or refused by the server's xgrammar backend"
    if "multipleOf" in node:  # vLLM refuses every typed one, xgrammar ignores the others
        yield "multipleOf", "refused by the server's xgrammar backend"
    yield from ((k, why) for k, why in weakened(node, pointer) if k not in _REFUSED_BY_VLLM)
    if "format" in node and node["format"] not in XGRAMMAR_FORMATS:
        yield "format", "a format the server's xgrammar backend refuses"
    if one_of_overlaps(root, node):
        yield (
            "oneOf",
            "read as anyOf by the server's xgrammar backend, and its branches may overlap",
        )
