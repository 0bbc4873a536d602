"""Tool calling: the OpenAI tools field, the union schema the decoder is held to, call ids,
and parsing model output back into tool calls or an answer.

The model never answers free-form when tools are given: it is constrained to one JSON
*envelope* described by :func:`union_schema`::

    {"tool": NAME, "arguments": {...}}                  one call
    {"tool_calls": [{"tool": ..., "arguments": ...}]}   several (parallel_tool_calls)
    {"answer": "..."}                                    no call (or the response_format value)

Everything the constrained decoder produced is validated again here with jsonschema-rs (defence
in depth: a backend bug must not turn into a receipt for arguments that fail their schema).

Decisions a reader may look for:

* with response_format the answer is ``{"answer": <value>}``, never the bare value, so a
  response schema that accepts objects cannot be mistaken for a call;
* objects that list properties are closed in the constraint (:func:`closed_schema`), strict
  or not; the client's schema itself is kept verbatim on the ToolSpec;
* branches are joined with ``anyOf`` (they are disjoint, so it means ``oneOf``);
* call ids are minted per call *index* by a request's :class:`CallIds`, so re-parsing the
  same output (retry, stream then final parse) keeps every id.
"""

from __future__ import annotations

import copy
import functools
import json
import re
import secrets
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import jsonschema
import jsonschema_rs
import msgspec

from runtime.constraint import json_text
from runtime.errors import (
    ConstraintTooComplex,
    InvalidSchema,
    InvalidTools,
    RuntimeInputError,
    StructuredOutputInvalid,
    UnknownTool,
)
from runtime.limits import (
    DEFAULT_LIMITS,
    Limits,
    check_schema_bounds,
    resolve_ref,
    schema_patterns,
)

TOOL_NAME_RE = re.compile(r"[a-zA-Z0-9_-]{1,64}")  # fullmatch: `$` would let a final \n in
CALL_ID_RE = re.compile(r"call_[0-9a-f]{24}")  # fullmatch, as TOOL_NAME_RE
EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}

# Subschema-bearing keywords walked when closing objects or rewriting $ref pointers.
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_SINGLES = (
    "items",
    "additionalProperties",
    "not",
    "if",
    "then",
    "else",
    "contains",
    "propertyNames",
    "unevaluatedProperties",
    "unevaluatedItems",
    "additionalItems",
)
_OPEN_KEYWORDS = ("additionalProperties", "patternProperties", "unevaluatedProperties")


# --------------------------------------------------------------------------- tools field


@dataclass(frozen=True)
class ToolSpec:
    """One validated function tool; ``parameters`` is the schema its arguments must satisfy."""

    name: str
    description: str
    parameters: dict[str, Any]
    strict: bool = False

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI ``tools[]`` item (what family prompts list inside ``<tools>``)."""
        function: dict[str, Any] = {"name": self.name}
        if self.description:
            function["description"] = self.description
        function["parameters"] = self.parameters
        return {"type": "function", "function": function}


def check_schema(schema: Any, param: str, limits: Limits = DEFAULT_LIMITS) -> None:
    """Reject a schema over the size or depth limit, that is not valid Draft 2020-12, or that
    points outside itself. The limits come first: the metaschema check is slow on large
    schemas and its cache keeps what it checked.

    Remote ``$ref`` would make validation fetch URLs (and backends cannot compile them).
    """
    if not isinstance(schema, dict):
        raise InvalidSchema(f"'{param}' must be a JSON schema object", param=param)
    try:
        canonical = _canonical(schema)  # the key of both caches below
    except (TypeError, ValueError) as exc:  # a Python caller's non-JSON value
        raise InvalidSchema(f"'{param}' is not JSON: {exc}", param=param) from None
    check_schema_bounds(canonical, limits, param)
    try:
        _check_metaschema(canonical)
    except RecursionError:  # jsonschema recurses per level: ~100 levels of properties do it
        raise ConstraintTooComplex(
            f"'{param}' nests too deep to check; keep it within max_schema_depth", param=param
        ) from None
    except _Inexact as exc:  # the manifest binds the schema in RFC 8785 canonical form
        raise InvalidSchema(
            f"'{param}' holds a number a receipt cannot record exactly ({exc})", param=param
        ) from None
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(root)"
        raise InvalidSchema(
            f"'{param}' is not a valid JSON schema at {where}: {exc.message}", param=param
        ) from None
    for ref in _refs(schema):
        if not ref.startswith("#"):
            raise InvalidSchema(
                f"'{param}' uses $ref {ref!r}: only local references ('#...') are supported",
                param=param,
            )
        if _loops(schema, ref):
            raise InvalidSchema(
                f"'{param}' has $ref {ref!r} leading back to itself through $refs alone: it"
                " stands for no schema (give the loop a schema with content)",
                param=param,
            )
    try:
        _validator(canonical)
    except (jsonschema_rs.ValidationError, jsonschema_rs.ReferencingError, ValueError) as exc:
        reason = getattr(exc, "message", None) or str(exc).splitlines()[0]
        raise InvalidSchema(f"'{param}' cannot be compiled: {reason}", param=param) from None


def parse_tools_field(tools: Any, limits: Limits = DEFAULT_LIMITS) -> tuple[ToolSpec, ...]:
    """Validate the OpenAI ``tools`` array; each error names the offending element."""
    if not isinstance(tools, list):
        raise InvalidTools("'tools' must be an array of tool objects", param="tools")
    if not tools:
        raise InvalidTools("'tools' must not be empty (omit it instead)", param="tools")
    specs: list[ToolSpec] = []
    seen: set[str] = set()
    for i, item in enumerate(tools):
        at = f"tools[{i}]"
        if not isinstance(item, dict):
            raise InvalidTools(f"'{at}' must be an object", param=at)
        if item.get("type") != "function":
            raise InvalidTools(
                f"'{at}.type' must be 'function', got {item.get('type')!r}", param=f"{at}.type"
            )
        fn = item.get("function")
        if not isinstance(fn, dict):
            raise InvalidTools(f"'{at}.function' must be an object", param=f"{at}.function")
        name = fn.get("name")
        if not isinstance(name, str) or not TOOL_NAME_RE.fullmatch(name):
            raise InvalidTools(
                f"'{at}.function.name' must match ^[a-zA-Z0-9_-]{{1,64}}$, got {name!r}",
                param=f"{at}.function.name",
            )
        if name in seen:
            raise InvalidTools(
                f"duplicate tool name {name!r} at '{at}.function.name'",
                param=f"{at}.function.name",
            )
        seen.add(name)
        description = fn.get("description")
        description = "" if description is None else description
        if not isinstance(description, str):
            raise InvalidTools(
                f"'{at}.function.description' must be a string",
                param=f"{at}.function.description",
            )
        strict = fn.get("strict", False)
        if not isinstance(strict, bool) and strict is not None:
            raise InvalidTools(
                f"'{at}.function.strict' must be a boolean", param=f"{at}.function.strict"
            )
        params = _tool_parameters(fn.get("parameters"), f"{at}.function.parameters", limits)
        specs.append(ToolSpec(name, description, params, bool(strict)))
    return tuple(specs)


def _tool_parameters(params: Any, param: str, limits: Limits) -> dict[str, Any]:
    if params is None or params == {}:
        return copy.deepcopy(EMPTY_PARAMETERS)
    if not isinstance(params, dict) or params.get("type") != "object":
        got = params.get("type") if isinstance(params, dict) else type(params).__name__
        raise InvalidTools(
            f"'{param}' must be a JSON schema of type 'object', got {got!r}", param=param
        )
    check_schema(params, param, limits)
    return copy.deepcopy(params)


def closed_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with every object that lists ``properties`` closed to exactly those.

    Constraints are built from this, strict or not (as OpenAI's strict mode and xgrammar's
    default do): left open, a small model fills arguments with invented keys, typically
    copied from the schema in its prompt ("type", "minLength"...). Objects that say how to
    treat other keys keep their rule, bare ``{"type": "object"}`` stays free-form, and
    ``allOf`` members stay open (closing each would make their intersection unsatisfiable).
    ``anyOf``/``oneOf`` members are closed when they are the object's whole description (a
    union of variants); under an object that lists properties or an open rule they read the
    same keys, so they stay open and the object lists the keys they name. A key that
    ``required`` names and ``properties`` does not is listed, taking any value (as the open
    object let it), or the closed object could never be valid. Anything valid against the
    result is valid against ``schema`` (but for ``oneOf``, whose exclusivity no grammar
    backend enforces anyway: outputs are validated against the tool's own schema).
    """
    out = copy.deepcopy(schema)

    def close(node: Any, *, keys_ruled: bool = False) -> None:
        """``keys_ruled``: an object this node applies to in place already rules its keys."""
        if not isinstance(node, dict):
            return
        described = "properties" in node or any(k in node for k in _OPEN_KEYWORDS)
        if "properties" in node and not keys_ruled and not any(k in node for k in _OPEN_KEYWORDS):
            node["additionalProperties"] = False
            properties = node["properties"]
            if isinstance(properties, dict):
                for key in _keys_named_in_place(node):
                    properties.setdefault(key, {})
        for sub in _subschemas(node, skip=_IN_PLACE):
            close(sub)
        for member in _in_place_members(node):
            close(member, keys_ruled=keys_ruled or described)

    close(out)
    return out


# Subschemas that read the same object as the node holding them. Inside ``not`` and ``if``
# closing would widen what the whole accepts (the negation of a narrower schema), so nothing
# there is touched; ``allOf`` members stay open (see closed_schema).
_IN_PLACE = frozenset({"anyOf", "oneOf", "allOf", "not", "if", "then", "else", "dependentSchemas"})


def _in_place_members(node: dict[str, Any]) -> Iterable[Any]:
    """The subschemas closed_schema closes as parts of ``node``'s own object."""
    for key in ("anyOf", "oneOf"):
        members = node.get(key)
        yield from members if isinstance(members, list) else ()
    yield from (node[key] for key in ("then", "else") if isinstance(node.get(key), dict))
    dependent = node.get("dependentSchemas")
    yield from dependent.values() if isinstance(dependent, dict) else ()


def _keys_named_in_place(node: dict[str, Any]) -> list[str]:
    """Keys ``node`` requires, and those its in-place parts (``allOf``, ``anyOf``, ``oneOf``,
    ``then``, ``else``, ``dependentSchemas``: they read the same object) list or require, at
    any depth; in the schema's order, so the closed schema's text is stable."""
    required = node.get("required")
    keys = [k for k in required if isinstance(k, str)] if isinstance(required, list) else []
    conjuncts = node.get("allOf")
    for part in [*(conjuncts if isinstance(conjuncts, list) else ()), *_in_place_members(node)]:
        if isinstance(part, dict):
            listed = part.get("properties")
            keys += list(listed) if isinstance(listed, dict) else []
            keys += _keys_named_in_place(part)
    return keys


# --------------------------------------------------------------------------- response_format


@dataclass(frozen=True)
class ResponseFormat:
    """The OpenAI ``response_format``: ``schema`` is None only for type "text"."""

    type: Literal["text", "json_object", "json_schema"]
    schema: dict[str, Any] | None = None
    name: str | None = None
    strict: bool = False

    @property
    def constrains(self) -> bool:
        return self.type != "text"


def parse_response_format(value: Any, limits: Limits = DEFAULT_LIMITS) -> ResponseFormat | None:
    """Validate ``response_format``; json_object becomes the schema ``{"type": "object"}``."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise RuntimeInputError("'response_format' must be an object", param="response_format")
    kind = value.get("type")
    if kind == "text":
        return ResponseFormat("text")
    if kind == "json_object":
        return ResponseFormat("json_object", {"type": "object"})
    if kind != "json_schema":
        raise RuntimeInputError(
            "'response_format.type' must be one of 'text', 'json_object', 'json_schema', "
            f"got {kind!r}",
            param="response_format.type",
        )
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise InvalidSchema(
            "'response_format.json_schema' must be an object", param="response_format.json_schema"
        )
    name = spec.get("name")
    if name is not None and (not isinstance(name, str) or not TOOL_NAME_RE.fullmatch(name)):
        raise InvalidSchema(
            "'response_format.json_schema.name' must match ^[a-zA-Z0-9_-]{1,64}$",
            param="response_format.json_schema.name",
        )
    schema = spec.get("schema")
    check_schema(schema, "response_format.json_schema.schema", limits)
    return ResponseFormat("json_schema", copy.deepcopy(schema), name, bool(spec.get("strict")))


# --------------------------------------------------------------------------- tool_choice


@dataclass(frozen=True)
class ToolChoice:
    """tool_choice normalised: ``name`` is set only for mode "named"."""

    mode: Literal["none", "auto", "required", "named"]
    name: str | None = None

    def allows(self, tool: str) -> bool:
        return self.mode == "auto" or self.mode == "required" or self.name == tool

    @property
    def allows_answer(self) -> bool:
        return self.mode in ("none", "auto")

    @property
    def allows_calls(self) -> bool:
        return self.mode != "none"


def parse_tool_choice(value: Any, tools: Sequence[ToolSpec]) -> ToolChoice:
    """OpenAI's forms: "none" | "auto" | "required" | {"type":"function","function":{"name"}}."""
    if value is None:
        return ToolChoice("auto")
    if isinstance(value, ToolChoice):
        choice = value
    elif value in ("none", "auto", "required"):
        choice = ToolChoice(value)
    elif isinstance(value, dict) and value.get("type") == "function":
        fn = value.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str):
            raise InvalidTools(
                "'tool_choice.function.name' must be a string", param="tool_choice.function.name"
            )
        choice = ToolChoice("named", name)
    else:
        raise InvalidTools(
            "'tool_choice' must be 'none', 'auto', 'required' or "
            '{"type": "function", "function": {"name": ...}}',
            param="tool_choice",
        )
    if choice.mode == "named" and choice.name not in {t.name for t in tools}:
        available = ", ".join(t.name for t in tools) or "(none)"
        raise UnknownTool(
            f"tool_choice names {choice.name!r}, which is not in 'tools' (available: {available})",
            param="tool_choice",
        )
    return choice


# --------------------------------------------------------------------------- union schema


def union_schema(
    tools: Sequence[ToolSpec],
    tool_choice: Any = "auto",
    response_format: ResponseFormat | Mapping[str, Any] | None = None,
    parallel_tool_calls: bool = False,
) -> dict[str, Any]:
    """The one JSON schema the decoder is held to when tools are given.

    Branches are mutually exclusive by their required key ("tool", "tool_calls", "answer")
    and closed (additionalProperties false), so they are joined with ``anyOf``, which means
    the same as ``oneOf`` here and which every backend compiles (llguidance refuses a
    ``oneOf`` it cannot prove disjoint, e.g. across ``$ref``). With
    ``response_format`` the answer branch is ``{"answer": <response schema>}``: wrapping keeps
    a response schema that itself accepts objects from ever matching a tool call. A tool whose
    parameters use ``$ref`` is moved under ``$defs`` with its pointers rewritten, so refs keep
    resolving once embedded; calls shared by the single and parallel forms live in ``$defs``
    too, so the schema (and its compile time) does not double.
    """
    choice = parse_tool_choice(tool_choice, tools)
    rf = response_format
    if isinstance(rf, Mapping):
        rf = parse_response_format(dict(rf))
    defs: dict[str, Any] = {}
    branches: list[dict[str, Any]] = []
    allowed = [t for t in tools if choice.allows(t.name)] if choice.allows_calls else []
    if allowed and parallel_tool_calls:
        for tool in allowed:
            defs[f"call-{tool.name}"] = _call_branch(tool, defs)
        refs = [{"$ref": f"#/$defs/call-{t.name}"} for t in allowed]
        items = refs[0] if len(refs) == 1 else {"anyOf": refs}
        branches.extend(refs)
        branches.append(
            _closed_object({"tool_calls": {"type": "array", "items": items, "minItems": 1}})
        )
    else:
        branches.extend(_call_branch(t, defs) for t in allowed)
    if choice.allows_answer:
        answer: dict[str, Any] = {"type": "string"}
        if rf is not None and rf.schema is not None:
            answer = _embed(closed_schema(rf.schema), "answer", defs)
        branches.append(_closed_object({"answer": answer}))
    schema = branches[0] if len(branches) == 1 else {"anyOf": branches}
    if defs:
        schema["$defs"] = defs
    return schema


def union_calls(union: dict[str, Any]) -> tuple[tuple[str, dict[str, Any]], ...]:
    """(tool name, arguments schema) of each single-call branch of a :func:`union_schema`.

    For engines that constrain per tool (vLLM structural tags) and only see the constraint:
    the union's layout stays this module's business. An arguments schema may ``$ref`` into
    the union's ``$defs``; carry those along.
    """
    defs = union.get("$defs", {})
    calls = []
    for branch in union.get("anyOf", [union]):
        ref = branch.get("$ref", "")
        if ref.startswith("#/$defs/"):
            branch = defs[ref.removeprefix("#/$defs/")]
        props = branch.get("properties", {})
        if "tool" in props and "arguments" in props:
            calls.append((props["tool"]["const"], props["arguments"]))
    return tuple(calls)


def _call_branch(tool: ToolSpec, defs: dict[str, Any]) -> dict[str, Any]:
    arguments = _embed(closed_schema(tool.parameters), f"tool-{tool.name}", defs)
    return _closed_object({"tool": {"const": tool.name}, "arguments": arguments})


def _closed_object(properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


def _embed(schema: dict[str, Any], key: str, defs: dict[str, Any]) -> dict[str, Any]:
    """``schema`` placed inside the union; with local ``$ref``s it moves to ``$defs[key]``."""
    body = {k: v for k, v in schema.items() if k != "$schema"}
    if not any(True for _ in _refs(body)):
        return body
    defs[key] = _rewrite_refs(body, f"#/$defs/{key}")
    return {"$ref": f"#/$defs/{key}"}


def _rewrite_refs(node: Any, base: str) -> Any:
    if isinstance(node, dict):
        out = {k: _rewrite_refs(v, base) for k, v in node.items()}
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#"):
            out["$ref"] = base + ref[1:]
        return out
    if isinstance(node, list):
        return [_rewrite_refs(v, base) for v in node]
    return node


def _subschemas(node: dict[str, Any], skip: Container[str] = ()) -> Iterable[Any]:
    for key in _SCHEMA_MAPS:
        sub = node.get(key)
        if isinstance(sub, dict) and key not in skip:
            yield from sub.values()
    for key in _SCHEMA_LISTS:
        sub = node.get(key)
        if isinstance(sub, list) and key not in skip:
            yield from sub
    for key in _SCHEMA_SINGLES:
        sub = node.get(key)
        if isinstance(sub, dict) and key not in skip:
            yield sub


# Keywords that do not constrain the value: a node holding only these besides a $ref (or a
# one-member allOf of one) stands for its target alone.
_NOT_CONSTRAINING = frozenset(
    {
        "title", "description", "$comment", "examples", "default", "deprecated",
        "readOnly", "writeOnly", "$anchor", "$id", "$schema", "$defs", "definitions",
    }
)  # fmt: skip


def _loops(schema: dict[str, Any], ref: str) -> bool:
    """Whether following ``ref`` through nodes that stand for their target alone comes back
    to a ref already followed: a loop with no schema in it, which compilers turn into an
    empty token mask mid-output (a 500) or a crash of the vLLM server's request."""
    followed: set[str] = set()
    while ref not in followed:
        followed.add(ref)
        target = _alias_of(resolve_ref(schema, ref))
        if target is None:
            return False
        ref = target
    return True


def _alias_of(node: Any) -> str | None:
    """The $ref a node stands for alone (beside keywords that do not constrain, or as the one
    member of an allOf), or None."""
    if not isinstance(node, dict):
        return None
    rest = node.keys() - _NOT_CONSTRAINING
    if rest == {"$ref"}:
        return node["$ref"] if isinstance(node["$ref"], str) else None
    if rest == {"allOf"} and isinstance(node["allOf"], list) and len(node["allOf"]) == 1:
        member = node["allOf"][0]
        if isinstance(member, dict) and member.keys() - _NOT_CONSTRAINING == {"$ref"}:
            return member["$ref"] if isinstance(member["$ref"], str) else None
    return None


def _refs(node: Any) -> Iterable[str]:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str):
            yield ref
        for value in node.values():
            yield from _refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _refs(value)


# --------------------------------------------------------------------------- call ids


def new_call_id() -> str:
    """``call_`` + 24 lowercase hex from the OS CSPRNG (96 bits: collisions are not a concern)."""
    return "call_" + secrets.token_hex(12)


@dataclass
class CallIds:
    """Ids by call index, minted on first use and then stable.

    One instance lives as long as one request: a post-hoc retry, the stream decoder and the
    final parse all ask it for call ``i`` and get the same id, so an id is minted once per
    call no matter how many times its text is parsed.
    """

    _ids: list[str] = field(default_factory=list)

    def for_index(self, index: int) -> str:
        while len(self._ids) <= index:
            self._ids.append(new_call_id())
        return self._ids[index]


# --------------------------------------------------------------------------- parsed output


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: dict[str, Any]
    text: str | None = None  # the arguments as the model wrote them, when it wrote JSON text

    def arguments_json(self) -> str:
        """The arguments as OpenAI returns them, a string: the model's own JSON text, which
        is what a stream sends; compact JSON when the model's format had none."""
        if self.text is not None:
            return self.text
        return json.dumps(self.arguments, ensure_ascii=False, separators=(",", ":"))

    def written_as(self, text: str | None) -> ToolCall:
        """This call with the model's JSON text of its arguments (None: keep it as is)."""
        return self if text is None else replace(self, text=text)

    def to_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments_json()},
        }


ResponseKind = Literal["tool_calls", "answer", "parsed", "text"]


@dataclass(frozen=True)
class ParsedResponse:
    """What a model output means: calls, a plain answer, a structured value, or free text.

    ``content`` is what an OpenAI response carries as ``message.content`` (None for calls
    without text); ``parsed`` is set only for structured content, never for tool calls.
    ``complete`` is False for text cut off (token limit, stop string) before its constraint
    was satisfied: returned as far as it got, as OpenAI does, but it conforms to nothing.
    """

    kind: ResponseKind
    answer: str | None = None
    parsed: Any = None
    tool_calls: tuple[ToolCall, ...] = ()
    content: str | None = None
    reasoning: str | None = None
    complete: bool = True


def parse_envelope(
    text: str,
    tools: Sequence[ToolSpec],
    *,
    schema: dict[str, Any] | None = None,
    response_schema: dict[str, Any] | None = None,
    ids: CallIds | None = None,
) -> ParsedResponse:
    """Parse and re-validate the JSON envelope produced under :func:`union_schema`.

    ``schema`` (the union) catches what per-part checks cannot, such as an answer under
    tool_choice "required"; ``response_schema`` marks the answer as structured content.
    """
    envelope = load_json(text, schema or {})
    return _from_envelope(envelope, text, tools, schema, response_schema, ids or CallIds())


_SPACE = re.compile(r"[ \t\n\r]*")


def envelope_texts(text: str) -> dict[tuple[str | int, ...], str]:
    """The JSON text of each value of the envelope `text` (valid JSON), by path: ("answer",),
    ("arguments",), ("tool_calls", 0, "arguments")... As the model wrote them, which is what
    runtime/streaming.py sends, so a response and its stream carry the same bytes (a number
    written 1.50 stays 1.50). Only the envelope's object and the tool_calls array are walked;
    every other value is one raw_decode."""
    found: dict[tuple[str | int, ...], str] = {}

    def skip(i: int) -> int:
        return _SPACE.match(text, i).end()  # type: ignore[union-attr]  # * always matches

    def value(i: int, path: tuple[str | int, ...]) -> int:
        i = skip(i)
        walked = path == () or (len(path) == 2 and path[0] == "tool_calls")
        if walked and text.startswith("{", i):
            return members(i, path, "}")
        if path == ("tool_calls",) and text.startswith("[", i):
            return members(i, path, "]")
        end = EXACT_JSON.raw_decode(text, i)[1]
        found[path] = text[i:end]
        return end

    def members(i: int, path: tuple[str | int, ...], close: str) -> int:
        i = skip(i + 1)
        index = 0
        while not text.startswith(close, i):
            if close == "}":
                key, i = json.decoder.scanstring(text, i + 1)  # type: ignore[attr-defined]
                i = value(skip(i) + 1, (*path, key))  # past the ':'
            else:
                i = value(i, (*path, index))
                index += 1
            i = skip(i)
            if text.startswith(",", i):
                i = skip(i + 1)
        return i + 1

    value(0, ())
    return found


def _from_envelope(
    envelope: Any,
    raw: str,
    tools: Sequence[ToolSpec],
    schema: dict[str, Any] | None,
    response_schema: dict[str, Any] | None,
    ids: CallIds,
) -> ParsedResponse:
    union = schema or {}
    if not isinstance(envelope, dict):
        raise StructuredOutputInvalid(
            "tool envelope is not a JSON object", schema=union, raw_output=raw, pointer=""
        )
    by_name = {t.name: t for t in tools}
    if "tool_calls" in envelope and isinstance(envelope["tool_calls"], list):
        items = [(f"/tool_calls/{i}", c) for i, c in enumerate(envelope["tool_calls"])]
    elif "tool" in envelope:
        items = [("", envelope)]
    else:
        items = []
    texts = envelope_texts(raw) if items or response_schema is not None else {}
    calls = tuple(
        _call_from(item, at, by_name, raw, union, ids.for_index(i)).written_as(
            texts.get((*_path(at), "arguments"))
        )
        for i, (at, item) in enumerate(items)
    )
    if not calls and response_schema is not None and "answer" in envelope:
        # before the union, whose anyOf could only say the whole envelope fails
        validate(envelope["answer"], response_schema, raw, prefix="/answer")
    if schema is not None:
        validate(envelope, schema, raw)
    if calls:
        return ParsedResponse("tool_calls", tool_calls=calls)
    if "answer" not in envelope:
        raise StructuredOutputInvalid(
            "tool envelope has none of 'tool', 'tool_calls', 'answer'",
            schema=union,
            raw_output=raw,
            pointer="",
        )
    answer = envelope["answer"]
    if response_schema is not None:
        return ParsedResponse("parsed", parsed=answer, content=texts[("answer",)])
    if not isinstance(answer, str):
        raise StructuredOutputInvalid(
            "'answer' must be a string", schema=union, raw_output=raw, pointer="/answer"
        )
    return ParsedResponse("answer", answer=answer, content=answer)


def _path(pointer: str) -> tuple[str | int, ...]:
    """A JSON pointer of the envelope ("/tool_calls/0") as an envelope_texts path."""
    return tuple(int(p) if p.isdigit() else p for p in pointer.split("/")[1:])


def _call_from(
    item: Any,
    at: str,
    by_name: Mapping[str, ToolSpec],
    raw: str,
    union: dict[str, Any],
    call_id: str,
    name_key: str = "tool",
) -> ToolCall:
    if not isinstance(item, dict):
        raise StructuredOutputInvalid(
            "a tool call is not a JSON object", schema=union, raw_output=raw, pointer=at
        )
    name = item.get(name_key)
    tool = by_name.get(name) if isinstance(name, str) else None
    if tool is None:
        raise StructuredOutputInvalid(
            f"the output calls unknown tool {name!r}",
            schema=union,
            raw_output=raw,
            pointer=f"{at}/{name_key}",
        )
    arguments = item.get("arguments", {})
    if isinstance(arguments, str):  # some native formats carry arguments as a JSON string
        arguments = load_json(arguments, tool.parameters, pointer=f"{at}/arguments")
    validate(arguments, tool.parameters, raw, prefix=f"{at}/arguments")
    return ToolCall(call_id, tool.name, arguments)


# --------------------------------------------------------------------------- native formats

# Qwen 2.5/3 and Hermes-2-Pro: <tool_call>{"name": ..., "arguments": {...}}</tool_call>
_TOOL_CALL_TAGS = re.compile(r"<tool_call>\s*(?P<body>\{.*?\})\s*</tool_call>", re.DOTALL)
_NATIVE_PATTERNS = {
    "qwen": _TOOL_CALL_TAGS,
    "hermes": _TOOL_CALL_TAGS,
    # Llama 3.1/3.2 custom tools: <function=NAME>{...}</function>
    "llama": re.compile(
        r"<function=(?P<name>[a-zA-Z0-9_-]{1,64})>(?P<body>.*?)</function>", re.DOTALL
    ),
}


def parse_native_tool_call(
    text: str,
    family: str,
    tools: Sequence[ToolSpec],
    *,
    ids: CallIds | None = None,
) -> ParsedResponse:
    """Calls written in a family's own tags (unconstrained or trigger-constrained output).

    Inside Qwen/Hermes tags both ``{"name", "arguments"}`` (the trained format) and the
    envelope (``{"tool", "arguments"}`` or ``{"tool_calls": [...]}``) are accepted; text outside the tags is kept as
    content. Output without any call is returned as kind "text". The generic family has no
    tags: its output is the envelope itself.
    """
    ids = ids or CallIds()
    if family == "generic":
        return parse_envelope(text, tools, ids=ids)
    pattern = _NATIVE_PATTERNS.get(family)
    if pattern is None:
        raise ValueError(f"unknown tool-call family {family!r}")
    items: list[Any] = []
    for match in pattern.finditer(text):
        at = f"/tool_calls/{len(items)}"
        if family == "llama":
            arguments = load_json(match["body"].strip() or "{}", {}, pointer=f"{at}/arguments")
            items.append({"name": match["name"], "arguments": arguments})
            continue
        body = load_json(match["body"], {}, pointer=at)
        several = body.get("tool_calls") if isinstance(body, dict) else None
        items.extend(several if isinstance(several, list) else [body])
    by_name = {t.name: t for t in tools}
    calls = [
        _call_from(
            item,
            f"/tool_calls/{i}",
            by_name,
            text,
            {},
            ids.for_index(i),
            name_key="tool" if isinstance(item, dict) and "tool" in item else "name",
        )
        for i, item in enumerate(items)
    ]
    rest = pattern.sub("", text).strip()
    if not calls:
        return ParsedResponse("text", content=text)
    return ParsedResponse("tool_calls", tool_calls=tuple(calls), content=rest or None)


# --------------------------------------------------------------------------- validation
# Agents send the same tools with every request, and a metaschema check costs milliseconds:
# both caches are keyed by canonical schema text, so each distinct schema is checked and
# built once per process. Failures raise and are never cached. Outputs are validated with
# jsonschema-rs, the validator receipts/binding.py verifies receipts with, so the verdict a
# receipt records and an auditor's re-check come from the same implementation (and it is
# 50x faster than jsonschema per value); the metaschema check keeps jsonschema's messages.


_sorted_json = msgspec.json.Encoder(order="sorted").encode


def _canonical(schema: dict[str, Any]) -> bytes:
    return json_text(schema, _sorted_json)


# Keyed by schemas up to max_schema_bytes (64 KB by default): 1,024 of them stay under 200 MB.
@functools.lru_cache(maxsize=1024)
def _check_metaschema(canonical: bytes) -> None:
    """jsonschema-rs decides (1 ms for a 60 KB schema where python-jsonschema took 0.76 s,
    on the event loop); python-jsonschema runs only on a schema it refuses, for the message
    naming where. Always Draft 2020-12's metaschema, from jsonschema-rs's own copy: the
    schema's ``$schema`` must not choose it (that made it fetch any URL or file)."""
    schema = _load_exact(canonical)
    if not _metaschema().is_valid(schema):
        jsonschema.Draft202012Validator.check_schema(schema)
    for pattern in schema_patterns(schema):  # the limits read patterns with Python's parser
        try:
            re.compile(pattern)
        except (re.error, OverflowError) as exc:  # OverflowError: a bound past 2**32
            raise jsonschema.SchemaError(f"{pattern!r} is not a valid regex: {exc}") from None


@functools.cache
def _metaschema() -> jsonschema_rs.Validator:
    return jsonschema_rs.Draft202012Validator(
        {"$ref": "https://json-schema.org/draft/2020-12/schema"}, offline=True
    )


@functools.lru_cache(maxsize=1024)
def _validator(canonical: bytes) -> jsonschema_rs.Validator:
    return jsonschema_rs.Draft202012Validator(json.loads(canonical), offline=True)


def validate(value: Any, schema: dict[str, Any], raw: str, *, prefix: str = "") -> None:
    """Raise StructuredOutputInvalid at the JSON pointer of the first failure."""
    validator = _validator(_canonical(schema))
    if validator.is_valid(value):
        return
    try:
        error = next(validator.iter_errors(value))
        path, message = error.instance_path, error.message
    except (ValueError, StopIteration):  # nested too deep for jsonschema-rs to report where
        path, message = [], "the value does not match (nested too deep to report where)"
    pointer = prefix + "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in path)
    raise StructuredOutputInvalid(
        f"output fails its schema at {repr(pointer) if pointer else 'the root'}: {message}",
        schema=schema,
        raw_output=raw,
        pointer=pointer,
    )


# I-JSON's exact numbers (RFC 7493 section 2.2), the values a receipt's RFC 8785 canonical
# form holds without loss: integers within +-(2**53 - 1), finite doubles, no NaN.
MAX_EXACT_INTEGER = 2**53 - 1


class _Inexact(ValueError):
    """A number in the output that a receipt cannot hold exactly."""


def _exact_int(text: str) -> int:
    value = int(text)
    if abs(value) > MAX_EXACT_INTEGER:
        raise _Inexact(f"the integer {text} is outside +-(2**53 - 1)")
    return value


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise _Inexact(f"the number {text} overflows a double")
    return value


def _no_constant(name: str) -> None:
    raise _Inexact(f"{name} is not JSON")


# json's decoder with the exact-number rule; raises _Inexact (a ValueError) past it
EXACT_JSON = json.JSONDecoder(
    parse_int=_exact_int, parse_float=_finite_float, parse_constant=_no_constant
)


def _load_exact(text: str | bytes) -> Any:
    return EXACT_JSON.decode(text.decode() if isinstance(text, bytes) else text)


def load_json(text: str, schema: dict[str, Any], *, pointer: str = "") -> Any:
    """``json.loads`` of model output whose failure is a StructuredOutputInvalid carrying the
    schema. Numbers a receipt cannot hold exactly (NaN, overflow, integers past 2**53) fail
    here too: the schema may allow them, the signed receipt could not record them."""
    try:
        return _load_exact(text)
    except _Inexact as exc:
        why = f"output holds a number a receipt cannot record exactly ({exc})"
    except json.JSONDecodeError as exc:
        why = f"output is not valid JSON ({exc.msg}, char {exc.pos})"
    except RecursionError:
        why = "output is not JSON this gateway can read (nested too deep)"
    raise StructuredOutputInvalid(why, schema=schema, raw_output=text, pointer=pointer)


__all__ = [
    "CALL_ID_RE",
    "EXACT_JSON",
    "MAX_EXACT_INTEGER",
    "CallIds",
    "ParsedResponse",
    "ResponseFormat",
    "ToolCall",
    "ToolChoice",
    "ToolSpec",
    "check_schema",
    "closed_schema",
    "load_json",
    "new_call_id",
    "parse_envelope",
    "parse_native_tool_call",
    "parse_response_format",
    "parse_tool_choice",
    "parse_tools_field",
    "union_calls",
    "union_schema",
    "validate",
]
