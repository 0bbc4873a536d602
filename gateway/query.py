"""Query strings read strictly on the audit and admin routes.

Litestar drops query parameters a handler does not declare and keeps the last of a repeated
one. For an auditor a mistyped filter (`?tool=` for `?tool_name=`) would then read as
"everything matched", and `?tool_name=a&tool_name=b` as a filter on b alone; both are a 400
naming the parameter instead. An integer, in the query or the path, is ASCII digits only:
`1_0`, `+1` and `1e1` would each read as a number the client may not have meant.
`shaped` declares a parameter checked by its shape (gateway.shapes).
"""

from __future__ import annotations

import functools
import re
import typing
from typing import Any

from litestar.connection import ASGIConnection
from litestar.handlers import HTTPRouteHandler
from litestar.params import Parameter

from gateway.errors import APIError
from gateway.shapes import Shape

_PATH_PARAM = re.compile(r"\{(\w+)(?::\w+)?\}")
_DIGITS = re.compile(r"[0-9]+")


def shaped(shape: Shape) -> Any:
    """A query or path parameter of this shape: its pattern checked, its words in OpenAPI."""
    return Parameter(pattern=shape.pattern, description=shape.words)


def refuse_unknown_query(connection: ASGIConnection) -> None:
    """Every query parameter declared by the route, and given once; every integer, in the
    query or the path, written in ASCII digits (400 otherwise)."""
    handler: HTTPRouteHandler = connection.route_handler  # type: ignore[assignment]
    declared = _declared(handler)
    integers = _integers(handler)
    seen: set[str] = set()
    for name, value in connection.query_params.multi_items():
        if name in integers:
            _digits(name, value)
        if name not in declared:
            takes = ", ".join(sorted(declared)) or "no query parameters"
            raise APIError(
                400,
                f"unknown query parameter {name!r}; this route takes {takes}",
                code="unsupported_parameter",
                param=name,
            )
        if name in seen:
            raise APIError(
                400,
                f"query parameter {name!r} is given more than once",
                code="invalid_value",
                param=name,
            )
        seen.add(name)

    if integers:
        for template in handler.paths:
            found = _template_regex(template).search(connection.scope["path"])
            for name, raw in (found.groupdict() if found else {}).items():
                if name in integers:
                    _digits(name, raw)


def _digits(name: str, raw: str) -> None:
    """Python's int() also reads `1_0`, `+1`, ` 1` and other scripts' digits, and Litestar
    `1e1` for a query value: one seq, cursor or limit must not have many spellings."""
    if not _DIGITS.fullmatch(raw):
        raise APIError(
            400,
            f"{name} must be written in ASCII digits, got {raw!r}",
            code="invalid_value",
            param=name,
        )


@functools.cache
def _integers(handler: HTTPRouteHandler) -> frozenset[str]:
    """The handler's integer parameters (query or path)."""
    return frozenset(
        name
        for name, field in handler.parsed_fn_signature.parameters.items()
        if int in (field.annotation, *typing.get_args(field.annotation))
    )


@functools.cache
def _template_regex(template: str) -> re.Pattern[str]:
    """A route's path template (`/proofs/inclusion/{seq:int}`) as a regex matching the end of
    a request path, one group per path parameter, raw as the client wrote it."""
    parts = _PATH_PARAM.split(template)  # text, name, text, name, ..., text
    pattern = "".join(
        re.escape(part) if i % 2 == 0 else f"(?P<{part}>[^/]+)" for i, part in enumerate(parts)
    )
    return re.compile(pattern + "$")


@functools.cache
def _declared(handler: HTTPRouteHandler) -> frozenset[str]:
    """The handler's own query parameters: its signature minus path parameters, dependencies
    and the body (what Litestar would read from the query string)."""
    in_path = {name for path in handler.paths for name in _PATH_PARAM.findall(path)}
    skip = {*in_path, *handler.resolve_dependencies(), "data", "request", "self"}
    return frozenset(name for name in handler.parsed_fn_signature.parameters if name not in skip)
