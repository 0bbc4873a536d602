"""OpenAPI document details Litestar does not derive by itself.

* Request bodies declared with `forbid_unknown_fields` refuse unknown keys (a 400 naming the
  parameter), so their schemas say `additionalProperties: false`; otherwise the document
  promises that such requests are accepted.
* Litestar drops a field's numeric and length bounds when the field is optional
  (`Annotated[float, Meta(ge=0)] | None`), and any bound of 0, and a Meta's
  `extra_json_schema` (`const`); they are copied here from msgspec's own view of the Struct,
  so the document refuses what the server refuses: lengths and `extra_json_schema` onto the
  member of the field's `oneOf` they bound, numeric bounds onto the field's schema (they
  apply to numbers only).
* The chat endpoint answers `text/event-stream` when `stream` is true.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec
from litestar._openapi.schema_generation.plugins.struct import StructSchemaPlugin
from litestar.openapi.spec import (
    OpenAPIFormat,
    OpenAPIHeader,
    OpenAPIMediaType,
    OpenAPIResponse,
    OpenAPIType,
    Operation,
    Reference,
    Schema,
)

if TYPE_CHECKING:
    from litestar._openapi.schema_generation import SchemaCreator
    from litestar.typing import FieldDefinition

_NUMBER_BOUNDS = {
    "ge": "minimum",
    "le": "maximum",
    "gt": "exclusive_minimum",
    "lt": "exclusive_maximum",
}


class StrictStructSchemaPlugin(StructSchemaPlugin):
    def to_openapi_schema(
        self, field_definition: FieldDefinition, schema_creator: SchemaCreator
    ) -> Schema:
        schema = super().to_openapi_schema(field_definition, schema_creator)
        info = msgspec.inspect.type_info(field_definition.type_)
        if info.forbid_unknown_fields:
            schema.additional_properties = False
        for field in info.fields:
            prop = (schema.properties or {}).get(field.encode_name)
            if isinstance(prop, Schema):
                _copy_bounds(field.type, prop)
        return schema


_MEMBER_TYPES: dict[type, OpenAPIType] = {
    msgspec.inspect.IntType: OpenAPIType.INTEGER,
    msgspec.inspect.FloatType: OpenAPIType.NUMBER,
    msgspec.inspect.BoolType: OpenAPIType.BOOLEAN,
    msgspec.inspect.StrType: OpenAPIType.STRING,
    msgspec.inspect.ListType: OpenAPIType.ARRAY,
    msgspec.inspect.DictType: OpenAPIType.OBJECT,
}
_SCHEMA_KEYWORDS = {f.metadata.get("alias", f.name): f.name for f in dataclasses.fields(Schema)}


def _copy_bounds(field_type: msgspec.inspect.Type, prop: Schema) -> None:
    """Put msgspec's bounds of each member of the field's type where the document says it."""
    members = field_type.types if isinstance(field_type, msgspec.inspect.UnionType) else ()
    for member in members or (field_type,):
        extra: dict[str, Any] = {}
        if isinstance(member, msgspec.inspect.Metadata):
            extra = dict(member.extra_json_schema or {})
            extra.pop("description", None)  # Litestar places that one itself
            member = member.type
        openapi_type = _MEMBER_TYPES.get(type(member))
        if openapi_type is None:
            continue
        target = _member_schema(prop, openapi_type)
        for keyword, value in extra.items():
            setattr(target, _SCHEMA_KEYWORDS[keyword], value)
        if isinstance(member, msgspec.inspect.IntType | msgspec.inspect.FloatType):
            for bound, keyword in _NUMBER_BOUNDS.items():
                if getattr(member, bound) is not None:
                    setattr(prop, keyword, getattr(member, bound))
        elif isinstance(member, msgspec.inspect.StrType):
            _copy_lengths(member, target)
        elif isinstance(member, msgspec.inspect.ListType):
            if member.min_length is not None:
                target.min_items = member.min_length
            if member.max_length is not None:
                target.max_items = member.max_length
            if isinstance(member.item_type, msgspec.inspect.StrType) and isinstance(
                target.items, Schema
            ):
                _copy_lengths(member.item_type, target.items)


def _member_schema(prop: Schema, openapi_type: OpenAPIType) -> Schema:
    """The schema of ``prop``'s `oneOf` member of that type (``prop`` itself if none)."""
    return next(
        (s for s in prop.one_of or () if isinstance(s, Schema) and s.type == openapi_type),
        prop,
    )


def _copy_lengths(string: msgspec.inspect.StrType, target: Schema) -> None:
    if string.min_length is not None:
        target.min_length = string.min_length
    if string.max_length is not None:
        target.max_length = string.max_length


@dataclass
class ChatOperation(Operation):
    """POST /v1/chat/completions: its 200 is JSON, or with `stream: true` server-sent events."""

    def __post_init__(self) -> None:
        ok = (self.responses or {}).get("200")
        if isinstance(ok, OpenAPIResponse):
            ok.headers = {
                **(ok.headers or {}),
                "X-Callproof-Receipt": OpenAPIHeader(
                    schema=Schema(type=OpenAPIType.STRING, pattern="^rcpt_[0-9a-f]{24}$"),
                    description="the id of the answer's receipt, committed before the answer"
                    " left (JSON answers; a stream's last chunk carries `receipt` instead)",
                ),
            }
            ok.content = {
                **(ok.content or {}),
                "text/event-stream": OpenAPIMediaType(
                    schema=Schema(
                        type=OpenAPIType.STRING,
                        description="`data: <chat.completion.chunk JSON>` events, the last one"
                        " carrying `receipt`, then `data: [DONE]` (docs/api.md, Streaming)",
                    )
                ),
            }


@dataclass
class OptionalBodyOperation(Operation):
    """A POST whose JSON body may be left out (every member has a default): Litestar marks
    every request body required."""

    def __post_init__(self) -> None:
        if self.request_body is not None and not isinstance(self.request_body, Reference):
            self.request_body.required = False


@dataclass
class GzipOperation(Operation):
    """GET /audit/export: its 200 is the bundle's bytes, not JSON."""

    def __post_init__(self) -> None:
        ok = (self.responses or {}).get("200")
        if isinstance(ok, OpenAPIResponse):
            ok.content = {
                "application/gzip": OpenAPIMediaType(
                    schema=Schema(type=OpenAPIType.STRING, format=OpenAPIFormat.BINARY)
                )
            }
