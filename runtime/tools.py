"""Tool calling requests: the OpenAI tools, tool_choice and response_format fields, and the
union schema the decoder is held to.

The model never answers free-form when tools are given: it is constrained to one JSON
*envelope* described by :func:`union_schema`::

    {"tool": NAME, "arguments": {...}}                  one call
    {"tool_calls": [{"tool": ..., "arguments": ...}]}   several (parallel_tool_calls)
    {"answer": "..."}                                    no call (or the response_format value)

Reading that envelope back is runtime/output_parsing.py's business; checking the schemas
given here is runtime/schema_check.py's.

Decisions a reader may look for:

* with response_format the answer is ``{"answer": <value>}``, never the bare value, so a
  response schema that accepts objects cannot be mistaken for a call;
* objects that list properties are closed in the constraint (:func:`closed_schema`), strict
  or not; the client's schema itself is kept verbatim on the ToolSpec;
* branches are joined with ``anyOf`` (they are disjoint, so it means ``oneOf``).
"""

from __future__ import annotations

import copy
import re
import urllib.parse
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from runtime.errors import (
    ConstraintTooComplex,
    InvalidSchema,
    InvalidTools,
    RuntimeInputError,
    UnknownTool,
)
from runtime.limits import DEFAULT_LIMITS, Limits
from runtime.schema_check import check_schema, refs_in
from runtime.schema_walk import (
    DATA_KEYWORDS,
    SCHEMA_MAPS,
    pointer_token,
    resolve_ref,
    schema_resources,
)

TOOL_NAME_RE = re.compile(r"[a-zA-Z0-9_-]{1,64}")  # fullmatch: `$` would let a final \n in
EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}

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
    return _json_copy(params)


# --------------------------------------------------------------------------- closed objects

# Subschema-bearing keywords walked when closing objects.
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


# Subschemas closed_schema may read, and keys it may list, for the keys each object names in
# place (about 0.15 s): every object re-reads what it composes and lists its keys again, so
# many objects that each compose one wide allOf, or one $ref requiring thousands of keys, cost
# their product (2,000,000 keys listed, 5 s and 550 MB from 60 KB), and would be refused as
# too large only after.
MAX_IN_PLACE_READS = 50_000


def closed_schema(schema: dict[str, Any], *, param: str | None = None) -> dict[str, Any]:
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

    A local ``$ref`` counts as the schema it names, written where the ref is: its keys are
    listed on the object that applies it in place (a ``$ref`` beside ``properties``, in an
    ``allOf``, in the ``anyOf`` of a described object), and there it points at an open copy
    of its target (in ``$defs``, ``<name>-open``), since the target closed to its own keys
    made the composition (OpenAPI's ``allOf: [{$ref: Base}, ...]``) unsatisfiable. Refs
    used alone (a property's schema, a lone ``allOf`` member, an ``anyOf`` variant) keep
    the closed target. Refs are first made pointers from the root (:func:`_pointer_refs`).

    Raises ConstraintTooComplex (naming ``param``, the schema's place in the request) past
    MAX_IN_PLACE_READS.
    """
    out = _pointer_refs(schema)
    pristine = _json_copy(out)  # the targets open copies are made of
    open_refs: dict[str, str] = {}
    reads = 0

    def opened(ref: str) -> str:
        """The ref of an open copy of what ``ref`` names, made once (cycles end there)."""
        target = resolve_ref(pristine, ref)
        if ref in open_refs or not isinstance(target, dict):
            return open_refs.get(ref, ref)
        defs = out.setdefault("$defs", {})
        name = f"{ref.rpartition('/')[2].lstrip('#') or 'root'}-open"
        while name in defs:
            name += "-"
        open_refs[ref] = "#/$defs/" + _fragment(pointer_token(name))
        defs[name] = copy.deepcopy(
            {k: v for k, v in target.items() if k not in ("$defs", "definitions")}
        )
        close(defs[name], keys_ruled=True)
        return open_refs[ref]

    def close(node: Any, *, keys_ruled: bool = False) -> None:
        """``keys_ruled``: an object this node applies to in place already rules its keys."""
        nonlocal reads
        if not isinstance(node, dict):
            return
        described = "properties" in node or any(k in node for k in _OPEN_KEYWORDS)
        if "properties" in node and not keys_ruled and not any(k in node for k in _OPEN_KEYWORDS):
            node["additionalProperties"] = False
            properties = node["properties"]
            if isinstance(properties, dict):
                keys, read = _keys_named_in_place(node, pristine)
                reads += read + len(keys)
                if reads > MAX_IN_PLACE_READS:
                    raise ConstraintTooComplex(
                        f"the schema's objects compose more than {MAX_IN_PLACE_READS:,}"
                        " subschemas and keys in place (allOf, anyOf, oneOf, then, else,"
                        " dependentSchemas and $ref beside properties, counted again for each"
                        " object that composes them); define shared properties once instead"
                        " of composing them into every object",
                        param=param,
                    )
                for key in keys:
                    properties.setdefault(key, {})
        standalone = list(_subschemas(node, skip=_IN_PLACE))  # before opened() adds to $defs
        in_place = keys_ruled or described
        conjuncts = node.get("allOf")
        conjuncts = conjuncts if isinstance(conjuncts, list) else []
        composed = [node] if in_place else []
        composed += [m for m in conjuncts if in_place or len(conjuncts) > 1]
        for part in composed:
            if isinstance(part, dict) and isinstance(part.get("$ref"), str):
                part["$ref"] = opened(part["$ref"])
        for sub in standalone:
            close(sub)
        for member in _in_place_members(node):
            close(member, keys_ruled=in_place)

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


def _keys_named_in_place(node: dict[str, Any], root: dict[str, Any]) -> tuple[list[str], int]:
    """Keys ``node`` requires, and those its in-place parts (``allOf``, ``anyOf``, ``oneOf``,
    ``then``, ``else``, ``dependentSchemas``, the target of its ``$ref`` in ``root``: they
    read the same object) list or require, at any depth; in the schema's order, so the closed
    schema's text is stable. With the number of subschemas read: each once, however many
    refs name it (read once per path, refs that each name the next level twice took 2^depth
    steps, and a 2 KB schema held the event loop for minutes)."""
    keys: list[str] = []
    read: set[int] = set()  # ids of the subschemas read

    def read_part(part: dict[str, Any]) -> None:
        read.add(id(part))
        required = part.get("required")
        if isinstance(required, list):
            keys.extend(k for k in required if isinstance(k, str))
        ref = part.get("$ref")
        conjuncts = part.get("allOf")
        for sub in (
            resolve_ref(root, ref) if isinstance(ref, str) else None,
            *(conjuncts if isinstance(conjuncts, list) else ()),
            *_in_place_members(part),
        ):
            if isinstance(sub, dict) and id(sub) not in read:
                listed = sub.get("properties")
                keys.extend(listed if isinstance(listed, dict) else ())
                read_part(sub)

    read_part(node)
    return keys, len(read)


def _subschemas(node: dict[str, Any], skip: Container[str] = ()) -> Iterable[Any]:
    for key in SCHEMA_MAPS:
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


# --------------------------------------------------------------------------- response_format


@dataclass(frozen=True)
class ResponseFormat:
    """The OpenAI ``response_format``: ``schema`` is None only for type "text";
    ``description`` is the client's word on what the format is for (prompt text)."""

    type: Literal["text", "json_object", "json_schema"]
    schema: dict[str, Any] | None = None
    name: str | None = None
    strict: bool = False
    description: str = ""

    @property
    def constrains(self) -> bool:
        return self.type != "text"


RESPONSE_SCHEMA_PARAM = "response_format.json_schema.schema"  # where errors place the schema


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
    description = spec.get("description")
    description = "" if description is None else description
    if not isinstance(description, str):
        raise InvalidSchema(
            "'response_format.json_schema.description' must be a string",
            param="response_format.json_schema.description",
        )
    schema = spec.get("schema")
    check_schema(schema, RESPONSE_SCHEMA_PARAM, limits)
    return ResponseFormat(
        "json_schema", _json_copy(schema), name, bool(spec.get("strict")), description
    )


# --------------------------------------------------------------------------- tool_choice


@dataclass(frozen=True)
class ToolChoice:
    """tool_choice normalised: ``name`` is set only for mode "named"; ``allowed`` (OpenAI's
    allowed_tools) names the only tools "auto" or "required" may call (None: any of them)."""

    mode: Literal["none", "auto", "required", "named"]
    name: str | None = None
    allowed: tuple[str, ...] | None = None

    def allows(self, tool: str) -> bool:
        if self.allowed is not None and tool not in self.allowed:
            return False
        return self.mode == "auto" or self.mode == "required" or self.name == tool

    @property
    def allows_answer(self) -> bool:
        return self.mode in ("none", "auto")

    @property
    def allows_calls(self) -> bool:
        return self.mode != "none"


def parse_tool_choice(value: Any, tools: Sequence[ToolSpec]) -> ToolChoice:
    """OpenAI's forms: "none" | "auto" | "required" | {"type":"function","function":{"name"}}
    | {"type":"allowed_tools","allowed_tools":{"mode":"auto"|"required","tools":[...]}}."""
    if value is None:
        return ToolChoice("auto")
    if isinstance(value, ToolChoice):
        choice = value
    elif value in ("none", "auto", "required"):
        choice = ToolChoice(value)
    elif isinstance(value, dict) and value.get("type") == "function":
        choice = ToolChoice("named", _function_name(value, "tool_choice"))
    elif isinstance(value, dict) and value.get("type") == "allowed_tools":
        choice = _allowed_tools(value.get("allowed_tools"))
    else:
        raise InvalidTools(
            "'tool_choice' must be 'none', 'auto', 'required', "
            '{"type": "function", "function": {"name": ...}} or '
            '{"type": "allowed_tools", "allowed_tools": {"mode": ..., "tools": [...]}}',
            param="tool_choice",
        )
    named = [choice.name] if choice.mode == "named" else list(choice.allowed or ())
    known = {t.name for t in tools}
    for name in named:
        if name not in known:
            available = ", ".join(t.name for t in tools) or "(none)"
            raise UnknownTool(
                f"tool_choice names {name!r}, which is not in 'tools' (available: {available})",
                param="tool_choice",
            )
    return choice


def _function_name(entry: Any, param: str) -> str:
    """The name in ``{"type": "function", "function": {"name": ...}}``."""
    fn = entry.get("function") if isinstance(entry, dict) else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str):
        raise InvalidTools(
            f"'{param}.function.name' must be a string", param=f"{param}.function.name"
        )
    return name


def _allowed_tools(spec: Any) -> ToolChoice:
    """OpenAI's allowed_tools: the tools "auto" or "required" may call, named as a named
    tool_choice names one."""
    param = "tool_choice.allowed_tools"
    if not isinstance(spec, dict) or spec.get("mode") not in ("auto", "required"):
        raise InvalidTools(f"'{param}.mode' must be 'auto' or 'required'", param=f"{param}.mode")
    listed = spec.get("tools")
    if not isinstance(listed, list) or not listed:
        raise InvalidTools(f"'{param}.tools' must list at least one tool", param=f"{param}.tools")
    names = [_function_name(entry, f"{param}.tools[{i}]") for i, entry in enumerate(listed)]
    return ToolChoice(spec["mode"], allowed=tuple(dict.fromkeys(names)))


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
    allowed = (  # each with its index in tools, which errors name
        [(i, t) for i, t in enumerate(tools) if choice.allows(t.name)]
        if choice.allows_calls
        else []
    )
    if allowed and parallel_tool_calls:
        for i, tool in allowed:
            defs[f"call-{tool.name}"] = _call_branch(tool, i, defs)
        refs = [{"$ref": f"#/$defs/call-{t.name}"} for _, t in allowed]
        items = refs[0] if len(refs) == 1 else {"anyOf": refs}
        branches.extend(refs)
        branches.append(
            _closed_object({"tool_calls": {"type": "array", "items": items, "minItems": 1}})
        )
    else:
        branches.extend(_call_branch(t, i, defs) for i, t in allowed)
    if choice.allows_answer:
        answer: dict[str, Any] = {"type": "string"}
        if rf is not None and rf.schema is not None:
            answer = _embed(closed_schema(rf.schema, param=RESPONSE_SCHEMA_PARAM), "answer", defs)
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


def _call_branch(tool: ToolSpec, index: int, defs: dict[str, Any]) -> dict[str, Any]:
    """The envelope of one call of ``tool``, ``tools[index]`` in the request."""
    parameters = closed_schema(tool.parameters, param=f"tools[{index}].function.parameters")
    arguments = _embed(parameters, f"tool-{tool.name}", defs)
    return _closed_object({"tool": {"const": tool.name}, "arguments": arguments})


def _closed_object(properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


def _embed(schema: dict[str, Any], key: str, defs: dict[str, Any]) -> dict[str, Any]:
    """``schema`` placed inside the union; with local ``$ref``s it moves to ``$defs[key]``,
    its refs rewritten as pointers from the union's root (:func:`_pointer_refs`).

    Its root ``$id`` is dropped: kept, it made the embedded schema a resource of its own, and
    2020-12 resolves the rewritten ``#/$defs/<key>/...`` against that resource, where it
    dangles. Only local refs are allowed (runtime/schema_check.py), so nothing can name the
    schema by that URI."""
    body = {k: v for k, v in schema.items() if k not in ("$schema", "$id")}
    if not any(True for _ in refs_in(body)):
        return body
    defs[key] = _pointer_refs(body, f"#/$defs/{key}")
    return {"$ref": f"#/$defs/{key}"}


def _pointer_refs(schema: dict[str, Any], base: str = "#") -> dict[str, Any]:
    """A copy of ``schema`` whose local ``$ref``s are JSON pointers from its root, after
    ``base``, and in which nothing else names a part: 2020-12 resolves ``#/...`` from the
    nearest ``$id`` (a nested one starts a resource) and ``#name`` to that resource's
    ``$anchor``; rewritten so, nested ``$id``s and ``$anchor``s are dropped (moved into the
    union, a pointer re-based by a kept ``$id`` dangled, and two tools' anchors could
    clash). The refs of ``const``/``enum``/``default`` data are values, left alone."""
    text = msgspec.json.encode(schema)
    out = msgspec.json.decode(text)  # a copy (C, a tenth of copy.deepcopy's time)
    if b'"$id"' not in text and b'"$anchor"' not in text:  # one resource, no anchors
        if base != "#":
            _prefix_refs(out, base)
        return out  # the warm path of most tools: planning runs this per request
    nodes, anchors = schema_resources(out)
    for pointer, resource, node in nodes:
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#"):
            fragment = ref[1:]
            if fragment and not fragment.startswith("/"):  # an anchor
                named = anchors.get((resource, fragment))
                fragment = _fragment(named[0]) if named else None
            else:
                fragment = _fragment(resource) + fragment
            if fragment is not None:  # else unresolvable: validate_constraint names it
                node["$ref"] = base + fragment
        node.pop("$anchor", None)
        if pointer:
            node.pop("$id", None)
    return out


def _prefix_refs(node: Any, base: str) -> None:
    """In place: every schema object's local ``#...`` ref put after ``base``; names in
    ``properties``-like maps are walked as names, ``const``/``enum`` data left alone."""
    if isinstance(node, list):
        for item in node:
            _prefix_refs(item, base)
        return
    if not isinstance(node, dict):
        return
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#"):
        node["$ref"] = base + ref[1:]
    for key, value in node.items():
        if key in SCHEMA_MAPS and isinstance(value, dict):
            for sub in value.values():
                _prefix_refs(sub, base)
        elif key not in DATA_KEYWORDS:
            _prefix_refs(value, base)


def _json_copy(value: Any) -> Any:
    return msgspec.json.decode(msgspec.json.encode(value))


def _fragment(pointer: str) -> str:
    """A JSON pointer written as a URI fragment (RFC 6901 section 6: percent-encoded)."""
    return urllib.parse.quote(pointer, safe="/!$&'()*+,;=:@~")


__all__ = [
    "RESPONSE_SCHEMA_PARAM",
    "ResponseFormat",
    "ToolChoice",
    "ToolSpec",
    "closed_schema",
    "parse_response_format",
    "parse_tool_choice",
    "parse_tools_field",
    "union_calls",
    "union_schema",
]
