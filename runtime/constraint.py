"""One output constraint: a JSON schema, a regex, an EBNF grammar, or a tool union.

The canonical text is what the grammar cache keys on and what backends compile, so two
requests with the same constraint written differently (spacing) share one grammar. Key order
is kept: the backends generate properties in schema order (as OpenAI does), so two schemas
that differ in property order produce different outputs and are different constraints.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from runtime.errors import ConstraintUnsatisfiable, InvalidSchema
from runtime.gbnf import to_lark

ConstraintKind = Literal["json", "regex", "ebnf", "tools"]
# Strict JSON as every backend enforces it (llguidance's options): no whitespace between tokens
# (a weak model otherwise loops on whitespace) and only the properties a schema lists, as
# OpenAI's strict mode does.
STRICT_JSON_OPTIONS = {"whitespace_flexible": False, "coerce_one_of": False}
_UNSATISFIABLE = "Unsatisfiable schema:"  # how llguidance begins a schema it proved empty
# The request field each kind of constraint comes from: what an error about it names.
PARAM_OF_KIND: dict[ConstraintKind, str] = {
    "json": "response_format",
    "tools": "tools",
    "regex": "regex",
    "ebnf": "grammar",
}


@dataclass(frozen=True)
class Constraint:
    """``kind`` "tools" is a JSON schema (the tool union) kept apart for stats and triggers."""

    kind: ConstraintKind
    source: str  # canonical: compact JSON (key order kept) for json/tools, verbatim otherwise

    @classmethod
    def json_schema(cls, schema: dict[str, Any], *, kind: ConstraintKind = "json") -> Constraint:
        try:
            return cls(kind, json_text(schema).decode())
        except (TypeError, ValueError) as exc:  # only a Python caller can pass such a value
            raise InvalidSchema(
                f"the schema is not JSON: {exc}", param=PARAM_OF_KIND[kind]
            ) from None

    @classmethod
    def regex(cls, pattern: str) -> Constraint:
        return cls("regex", pattern)

    @classmethod
    def ebnf(cls, grammar: str) -> Constraint:
        return cls("ebnf", grammar)

    @property
    def param(self) -> str:
        """The request field this constraint came from."""
        return PARAM_OF_KIND[self.kind]

    @property
    def is_json(self) -> bool:
        return self.kind in ("json", "tools")

    def schema(self) -> dict[str, Any]:
        if not self.is_json:
            raise TypeError(f"a {self.kind} constraint has no JSON schema")
        return json.loads(self.source)


def json_text(value: Any, encode: Callable[[Any], bytes] = msgspec.json.encode) -> bytes:
    """``value`` as compact JSON (``encode``: msgspec's, or one of its encoders).

    msgspec writes NaN and the infinities as ``null`` where the stdlib wrote invalid JSON,
    so text holding a ``null`` is read back and compared: ValueError when ``value`` held
    what JSON cannot carry. (Text without one needs no check, and costs nothing more.)
    """
    data = encode(value)
    if b"null" in data and msgspec.json.decode(data) != value:
        raise ValueError("it holds NaN, an infinity or a Python value JSON cannot carry")
    return data


def validate_constraint(constraint: Constraint) -> None:
    """Reject malformed or unsatisfiable input with a typed error before any engine or backend
    sees it, so the embedded engine (its grammar cache) and vLLM (runtime.constraint_checks)
    answer bad input alike.

    Backends disagree on dialects and report bad input and missing features the same way;
    checking syntax once here is what lets the backend chain treat every later compile failure
    as "unsupported, try the next backend" without looping over a typo.

    * json/tools: a JSON object (or boolean) that passes its metaschema (jsonschema), whose
      output validator builds (every ``$ref`` resolves), and that admits some value as
      enforced (objects closed; an empty enum or a minLength over its maxLength does not).
    * regex: Python ``re`` syntax; the pattern must match the whole output.
    * ebnf: the Lark dialect of llguidance (``start: ...``); llama.cpp GBNF (``root ::= ...``)
      is accepted too and converted.
    """
    if constraint.is_json:
        _validate_schema(constraint)
        _check_satisfiable(constraint)
    elif constraint.kind == "regex":
        _validate_regex(constraint.source)
    elif constraint.kind == "ebnf":
        _validate_grammar(constraint.source)
    else:  # pragma: no cover - Constraint.kind is a closed Literal
        raise TypeError(f"unknown constraint kind {constraint.kind!r}")


def _validate_schema(constraint: Constraint) -> None:
    import jsonschema

    from runtime.exact_json import InexactNumber
    from runtime.schema_check import canonical_text, check_compiles, check_metaschema

    param = constraint.param
    if not constraint.source.startswith(("{", "true", "false")):
        raise InvalidSchema(
            f"a JSON schema must be an object, not {type(constraint.schema()).__name__}",
            param=param,
        )
    try:
        check_metaschema(constraint.source.encode())
    except InexactNumber as exc:
        raise InvalidSchema(
            f"the schema holds a number a receipt cannot record exactly ({exc})", param=param
        ) from None
    except jsonschema.SchemaError as exc:
        pointer = "/" + "/".join(str(p) for p in exc.absolute_path)
        raise InvalidSchema(
            f"invalid JSON schema at {pointer}: {exc.message}", param=param
        ) from None
    if constraint.source.startswith("{"):
        # The output is checked against this schema. A tool union is built from schemas
        # each checked alone: only here is it seen whole, its refs resolving or not.
        check_compiles(canonical_text(constraint.schema()), param, f"the {param} schema")


def _check_satisfiable(constraint: Constraint) -> None:
    """llguidance proves some schemas empty without a tokenizer (sub-millisecond): no backend
    and no retry could help those (lm-format-enforcer crashed on them, and the post-hoc path
    decoded for seconds to a 422), and vLLM's xgrammar answered with its source path."""
    import llguidance

    if not constraint.source.startswith("{"):  # true or false: nothing to prove
        return
    grammar = llguidance.LLMatcher.grammar_from_json_schema(
        constraint.source, overrides=STRICT_JSON_OPTIONS
    )
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, None)
    if is_error and messages[0].startswith(_UNSATISFIABLE):
        why = messages[0].strip().removeprefix(_UNSATISFIABLE).strip()
        raise ConstraintUnsatisfiable(
            f"the {constraint.param} schema, as enforced (objects closed: docs/api.md),"
            f" admits no value: {why}",
            param=constraint.param,
        )


def _validate_regex(pattern: str) -> None:
    from runtime.errors import InvalidRegex
    from runtime.regex_features import regex_problem

    problem = regex_problem(pattern)
    if problem is not None:
        raise InvalidRegex(f"invalid regex: {problem}", param="regex")


def _validate_grammar(grammar: str) -> None:
    from runtime.errors import InvalidGrammar
    from runtime.grammar_lex import lex_grammar

    if not grammar.strip():
        raise InvalidGrammar("the grammar is empty", param="grammar")
    try:
        lark = to_lark(grammar)
    except ValueError as exc:
        raise InvalidGrammar(f"invalid grammar: {exc}", param="grammar") from None
    import llguidance

    error = llguidance.LLMatcher.validate_grammar(llguidance.LLMatcher.grammar_from_lark(lark))
    if error:
        raise InvalidGrammar(f"invalid grammar: {error.strip()}", param="grammar")
    specials = lex_grammar(lark).specials
    if specials:
        # The model could write it, but the text it yields drops special tokens: the output
        # returned and recorded would not be one the grammar admits.
        raise ConstraintUnsatisfiable(
            f"the grammar asks for the special token {specials[0]}; output text holds no"
            " special tokens (they are dropped from it), so no output could match the"
            ' grammar as recorded; write the text as a string literal ("...") instead',
            param="grammar",
        )
