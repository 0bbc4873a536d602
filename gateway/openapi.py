"""OpenAPI document details Litestar does not derive by itself.

Request bodies declared with `forbid_unknown_fields` refuse unknown keys (a 400 naming the
parameter), so their schemas must say `additionalProperties: false`; otherwise the document
promises that such requests are accepted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec
from litestar._openapi.schema_generation.plugins.struct import StructSchemaPlugin

if TYPE_CHECKING:
    from litestar._openapi.schema_generation import SchemaCreator
    from litestar.openapi.spec import Schema
    from litestar.typing import FieldDefinition


class StrictStructSchemaPlugin(StructSchemaPlugin):
    def to_openapi_schema(
        self, field_definition: FieldDefinition, schema_creator: SchemaCreator
    ) -> Schema:
        schema = super().to_openapi_schema(field_definition, schema_creator)
        if msgspec.inspect.type_info(field_definition.type_).forbid_unknown_fields:
            schema.additional_properties = False
        return schema
