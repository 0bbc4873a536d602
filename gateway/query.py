"""Query strings read strictly on the audit and admin routes.

Litestar drops query parameters a handler does not declare and keeps the last of a repeated
one. For an auditor a mistyped filter (`?tool=` for `?tool_name=`) would then read as
"everything matched", and `?tool_name=a&tool_name=b` as a filter on b alone; both are a 400
naming the parameter instead.
"""

from __future__ import annotations

import functools
import re

from litestar.connection import ASGIConnection
from litestar.handlers import HTTPRouteHandler

from gateway.errors import APIError

_PATH_PARAM = re.compile(r"\{(\w+)(?::\w+)?\}")


def refuse_unknown_query(connection: ASGIConnection) -> None:
    """Every query parameter declared by the route, and given once (400 otherwise)."""
    declared = _declared(connection.route_handler)  # type: ignore[arg-type]
    seen: set[str] = set()
    for name, _ in connection.query_params.multi_items():
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


@functools.cache
def _declared(handler: HTTPRouteHandler) -> frozenset[str]:
    """The handler's own query parameters: its signature minus path parameters, dependencies
    and the body (what Litestar would read from the query string)."""
    in_path = {name for path in handler.paths for name in _PATH_PARAM.findall(path)}
    skip = {*in_path, *handler.resolve_dependencies(), "data", "request", "self"}
    return frozenset(name for name in handler.parsed_fn_signature.parameters if name not in skip)
