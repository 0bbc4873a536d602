"""Tool calling requests: the OpenAI tools, tool_choice and response_format fields, validated
into ToolSpec, ToolChoice and ResponseFormat. Each error names the offending field.

The client's schemas are checked (runtime/schema_check.py) and kept verbatim here; the
constraint built from them is runtime/union_schema.py's business.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from runtime.errors import InvalidSchema, InvalidTools, RuntimeInputError, UnknownTool
from runtime.limits import DEFAULT_LIMITS, Limits
from runtime.schema_check import check_schema

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


def _json_copy(value: Any) -> Any:
    return msgspec.json.decode(msgspec.json.encode(value))


__all__ = [
    "RESPONSE_SCHEMA_PARAM",
    "ResponseFormat",
    "ToolChoice",
    "ToolSpec",
    "parse_response_format",
    "parse_tool_choice",
    "parse_tools_field",
]
