"""One output constraint: a JSON schema, a regex, an EBNF grammar, or a tool union.

The canonical text is what the grammar cache keys on and what backends compile, so two
requests with the same constraint written differently (key order, spacing) share one grammar.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

ConstraintKind = Literal["json", "regex", "ebnf", "tools"]


@dataclass(frozen=True)
class Constraint:
    """``kind`` "tools" is a JSON schema (the tool union) kept apart for stats and triggers."""

    kind: ConstraintKind
    source: str  # canonical: sorted compact JSON for json/tools, verbatim for regex/ebnf

    @classmethod
    def json_schema(cls, schema: dict[str, Any], *, kind: ConstraintKind = "json") -> Constraint:
        return cls(kind, json.dumps(schema, sort_keys=True, separators=(",", ":")))

    @classmethod
    def regex(cls, pattern: str) -> Constraint:
        return cls("regex", pattern)

    @classmethod
    def ebnf(cls, grammar: str) -> Constraint:
        return cls("ebnf", grammar)

    @property
    def is_json(self) -> bool:
        return self.kind in ("json", "tools")

    def schema(self) -> dict[str, Any]:
        if not self.is_json:
            raise TypeError(f"a {self.kind} constraint has no JSON schema")
        return json.loads(self.source)
