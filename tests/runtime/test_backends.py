"""Every installed grammar backend on the real SmolLM2 tokenizer: compile, walk, refuse."""

from __future__ import annotations

import re
import time

import pytest
from grammar_testkit import matches, smol_tokenizer

from runtime.backends import BackendChain, available_backends, backend_order, make_backend
from runtime.backends.base import allocate_bitmask, bitmask_to_bool
from runtime.constraint import Constraint
from runtime.errors import (
    BackendCannotCompile,
    ConstraintTooComplex,
    EngineConfigError,
    InvalidGrammar,
)
from runtime.limits import Limits
from runtime.schema_keywords import overlapping_one_of, schema_keywords

BACKENDS = available_backends()

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "minLength": 1, "maxLength": 30},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {
            "type": "array",
            "items": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}$"},
            "maxItems": 3,
        },
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request):
    return make_backend(request.param, smol_tokenizer())


def test_all_four_backends_install_here():
    assert BACKENDS == ["llguidance", "xgrammar", "lm-format-enforcer", "outlines"]


@pytest.mark.parametrize(
    "text, ok",
    [
        ('{"city":"Paris","unit":"celsius"}', True),
        ('{"city":"Oslo","unit":"fahrenheit","days":["2024-01","2024-02"]}', True),
        ('{"city":"Paris","unit":"kelvin"}', False),
        ('{"city":"","unit":"celsius"}', False),
        ('{"city":"Paris"}', False),
        ('{"city":"Paris","unit":"celsius","extra":1}', False),
        ('{"city":"Paris","unit":"celsius","days":["24-01"]}', False),
    ],
)
def test_json_schema_walk(backend, text, ok):
    compiled = backend.compile(Constraint.json_schema(WEATHER))
    assert compiled.backend == backend.name
    assert matches(compiled.matcher(), text) is ok


@pytest.mark.parametrize("text, ok", [("123-abc", True), ("12-abc", False), ("123-", False)])
def test_regex_walk(backend, text, ok):
    assert matches(backend.compile(Constraint.regex(r"\d{3}-[a-z]+")).matcher(), text) is ok


@pytest.mark.parametrize(
    "grammar",
    [
        'start: "call " NAME "(" NUM ")"\nNAME: /[a-z]+/\nNUM: /[0-9]+/',  # Lark
        'root ::= "call " name "(" num ")"\nname ::= [a-z]+\nnum ::= [0-9]+',  # GBNF, converted
    ],
)
@pytest.mark.parametrize("text, ok", [("call f(12)", True), ("call F(12)", False)])
def test_grammar_walk(backend, grammar, text, ok):
    constraint = Constraint.ebnf(grammar)
    if "ebnf" not in backend.kinds:
        with pytest.raises(BackendCannotCompile, match="no ebnf support"):
            backend.compile(constraint)
        return
    assert matches(backend.compile(constraint).matcher(), text) is ok


@pytest.mark.parametrize(
    ("grammar", "text", "wrong"),
    [
        ('root ::= "\\u00e9abc"', "éabc", "ê"),
        ("root ::= [\\u00e0-\\u00ff]+", "àéÿ", "a"),
        ('root ::= "\\U0001F600"', "😀", "U0001F600"),
        ('root ::= "\\u0100\\u01ff"', "Āǿ", "x"),
        ('root ::= "\\u0022\\u005c"', '"\\', "x"),  # a quote and a backslash
        ("root ::= [\\u0021\\u002d\\u0023]+", "!-#", '"'),  # a dash, not a range
        ("root ::= [\\u005ea]+", "^a", "b"),  # a caret, not a negation
        ('root ::= "a\\u000ab"', "a\nb", "ab"),
    ],
)
@pytest.mark.parametrize("name", ["llguidance", "xgrammar"])
def test_gbnf_unicode_escapes_are_the_characters_they_name(name, grammar, text, wrong):
    """llguidance's GBNF converter dropped the leading zeros of \\u and \\U escapes: \\u00e9
    became \\ue9, which Lark refused (invalid_grammar quoting a line the client never wrote).
    xgrammar reads GBNF itself; both must admit the same characters."""
    compiled = make_backend(name, smol_tokenizer()).compile(Constraint.ebnf(grammar))
    assert matches(compiled.matcher(), text)
    assert not matches(compiled.matcher(), wrong)


def test_a_gbnf_escape_of_no_character_is_an_invalid_grammar():
    with pytest.raises(InvalidGrammar, match="UTF-16 surrogate"):
        BackendChain(smol_tokenizer()).compile(Constraint.ebnf('root ::= "\\uD83D\\uDE00"'))


def test_a_gbnf_grammar_nested_past_the_converter_says_so_in_words():
    """3,000 nested groups: the message was Python's "maximum recursion depth exceeded"."""
    nested = "root ::= " + "(" * 3000 + '"a"' + ")" * 3000
    with pytest.raises(InvalidGrammar, match="nest deeper than the converter follows") as info:
        BackendChain(smol_tokenizer()).compile(Constraint.ebnf(nested))
    assert "recursion" not in info.value.message


EMBEDDED = '{"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}'


@pytest.mark.parametrize(
    "grammar",
    [
        f'start: "Answer: " %json {EMBEDDED}',
        'start: "Answer: " %json {"x-guidance": {"whitespace_flexible": true}, ' + EMBEDDED[1:],
    ],
    ids=["plain", "asking-for-whitespace"],
)
@pytest.mark.parametrize(
    "text, ok",
    [('Answer: {"x":1}', True), ('Answer: {\n\n"x"\n:\n1}', False), ('Answer: { "x": 1 }', False)],
)
def test_json_in_a_grammar_is_compact_as_a_schema_constraint_is(grammar, text, ok):
    """STRICT_JSON_OPTIONS reached json and tools constraints only: a grammar's %json took
    any whitespace, and the model wrote newlines until max_tokens."""
    compiled = make_backend("llguidance", smol_tokenizer()).compile(Constraint.ebnf(grammar))
    assert matches(compiled.matcher(), text) is ok


EXACT = 2**53 - 1
INTEGERS = {
    "type": "object",
    "properties": {
        "n": {"type": "integer"},
        "m": {"type": ["integer", "null"], "maximum": 5},
    },
    "required": ["n", "m"],
}


@pytest.mark.parametrize(
    "text, ok",
    [
        (f'{{"n":{EXACT},"m":null}}', True),
        (f'{{"n":-{EXACT},"m":5}}', True),
        (f'{{"n":{EXACT + 1},"m":null}}', False),
        ('{"n":123456789012345678901234,"m":null}', False),
        (f'{{"n":0,"m":-{EXACT + 1}}}', False),
        ('{"n":0,"m":6}', False),
    ],
)
@pytest.mark.parametrize("name", ["llguidance", "xgrammar"])
def test_integers_are_decoded_within_what_a_receipt_holds(name, text, ok):
    """A plain integer let the model write digits until max_tokens, for output no receipt
    can hold (a 422). The bounds are the decoder's: the compiled grammar still carries the
    client's constraint, which the grammar cache keys on and the receipt binds."""
    constraint = Constraint.json_schema(INTEGERS)
    compiled = make_backend(name, smol_tokenizer()).compile(constraint)
    assert compiled.constraint == constraint
    assert matches(compiled.matcher(), text) is ok


def test_mask_gates_eos_and_termination(backend):
    tok = smol_tokenizer()
    matcher = backend.compile(Constraint.regex("(yes|no)")).matcher()
    mask = allocate_bitmask(len(tok))
    matcher.fill_next_token_bitmask(mask)
    allowed = bitmask_to_bool(mask[0], len(tok))
    assert not allowed[tok.eos_token_id]
    assert allowed[tok.encode("yes", add_special_tokens=False)[0]]
    assert not matcher.can_stop()
    for token in tok.encode("yes", add_special_tokens=False):
        assert matcher.accept_token(token)
    assert matcher.can_stop() and matcher.is_terminated()
    matcher.fill_next_token_bitmask(mask)
    assert bitmask_to_bool(mask[0], len(tok)).nonzero().flatten().tolist() == [tok.eos_token_id]
    matcher.reset()
    assert not matcher.can_stop()
    assert matches(matcher, "no")


def _obj(prop):
    return {
        "type": "object",
        "properties": {"v": prop},
        "required": ["v"],
        "additionalProperties": False,
    }


# keyword -> (schema, a valid instance, an instance that breaks only that keyword)
KEYWORD_PROBES = {
    "minimum/maximum": (
        _obj({"type": "integer", "minimum": 3, "maximum": 7}),
        '{"v":5}',
        '{"v":9}',
    ),
    "exclusiveMinimum": (_obj({"type": "integer", "exclusiveMinimum": 3}), '{"v":5}', '{"v":3}'),
    "multipleOf": (_obj({"type": "integer", "multipleOf": 5}), '{"v":10}', '{"v":7}'),
    "pattern": (_obj({"type": "string", "pattern": "^[a-z]+$"}), '{"v":"ab"}', '{"v":"aB"}'),
    "format": (_obj({"type": "string", "format": "date"}), '{"v":"2024-01-02"}', '{"v":"hi"}'),
    "not": (_obj({"type": "string", "not": {"const": "x"}}), '{"v":"y"}', '{"v":"x"}'),
    "uniqueItems": (
        _obj({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}),
        '{"v":[1,2]}',
        '{"v":[1,1]}',
    ),
    "contains": (
        _obj({"type": "array", "items": {"type": "integer"}, "contains": {"const": 1}}),
        '{"v":[1,2]}',
        '{"v":[2]}',
    ),
    "minProperties": (
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}},
            "minProperties": 1,
            "additionalProperties": False,
        },
        '{"a":1}',
        "{}",
    ),
    "patternProperties": (
        {
            "type": "object",
            "patternProperties": {"^x": {"type": "integer"}},
            "additionalProperties": False,
        },
        '{"x1":1}',
        '{"y":1}',
    ),
    "if/then": (
        _obj({"type": "integer", "if": {"minimum": 5}, "then": {"maximum": 6}}),
        '{"v":6}',
        '{"v":9}',
    ),
    "dependentRequired": (
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "dependentRequired": {"a": ["b"]},
            "additionalProperties": False,
        },
        '{"a":1,"b":2}',
        '{"a":1}',
    ),
    "allOf": (
        {
            "allOf": [
                _obj({"type": "integer"}),
                {"type": "object", "properties": {"v": {"maximum": 3}}},
            ]
        },
        '{"v":2}',
        '{"v":5}',
    ),
    "anyOf": (
        _obj({"anyOf": [{"type": "integer"}, {"type": "boolean"}]}),
        '{"v":true}',
        '{"v":"s"}',
    ),
    "$ref": (
        {
            "$defs": {"n": {"type": "integer"}},
            "type": "object",
            "properties": {"v": {"$ref": "#/$defs/n"}},
            "required": ["v"],
            "additionalProperties": False,
        },
        '{"v":1}',
        '{"v":"a"}',
    ),
    "prefixItems": (
        _obj(
            {
                "type": "array",
                "prefixItems": [{"type": "integer"}, {"type": "string"}],
                "items": False,
            }
        ),
        '{"v":[1,"a"]}',
        '{"v":["a",1]}',
    ),
}


# What each backend refuses (the chain then tries the next one), measured with the pinned
# library versions; a change either way is worth knowing about (an upgrade that starts to
# enforce a keyword, or one that stops and would otherwise be silently weaker).
REFUSED_BY = {
    "llguidance": {"contains", "dependentRequired", "if/then", "not", "uniqueItems"},
    "xgrammar": {
        *("allOf", "contains", "dependentRequired", "if/then", "not"),
        *("patternProperties", "uniqueItems"),
    },
    "lm-format-enforcer": {
        *("allOf", "contains", "dependentRequired", "exclusiveMinimum", "format", "if/then"),
        *("minProperties", "minimum/maximum", "multipleOf", "not", "patternProperties"),
        *("prefixItems", "uniqueItems"),
    },
    "outlines": {
        *("allOf", "contains", "dependentRequired", "exclusiveMinimum", "if/then"),
        *("minProperties", "minimum/maximum", "multipleOf", "not", "patternProperties"),
        "uniqueItems",
    },
}


@pytest.mark.parametrize("keyword", list(KEYWORD_PROBES))
def test_compiled_schema_keywords_are_enforced(backend, keyword):
    """A backend either refuses a schema or enforces all of it: never a silently weaker one.
    Which it does is pinned per backend, so a backend refusing everything cannot pass."""
    schema, valid, invalid = KEYWORD_PROBES[keyword]
    if keyword in REFUSED_BY[backend.name]:
        with pytest.raises(BackendCannotCompile):
            backend.compile(Constraint.json_schema(schema))
        return
    compiled = backend.compile(Constraint.json_schema(schema))
    assert matches(compiled.matcher(), valid)
    assert not matches(compiled.matcher(), invalid)


def test_llguidance_enforces_the_common_keywords():
    backend = make_backend("llguidance", smol_tokenizer())
    for keyword in ("minimum/maximum", "multipleOf", "pattern", "format", "allOf", "$ref"):
        schema, valid, invalid = KEYWORD_PROBES[keyword]
        compiled = backend.compile(Constraint.json_schema(schema))
        assert matches(compiled.matcher(), valid) and not matches(compiled.matcher(), invalid)


def test_chain_falls_through_to_the_next_backend():
    tok = smol_tokenizer()
    schema = KEYWORD_PROBES["minimum/maximum"][0]  # lm-format-enforcer ignores min/max
    chain = BackendChain(tok, ["lm-format-enforcer", "llguidance"])
    assert chain.compile(Constraint.json_schema(schema)).backend == "llguidance"
    grammar = Constraint.ebnf('start: "a"')
    assert BackendChain(tok, ["outlines", "xgrammar"]).compile(grammar).backend == "xgrammar"
    assert chain.compile(Constraint.regex("a+")).backend == "lm-format-enforcer"


def test_chain_names_every_reason_when_none_can_compile():
    chain = BackendChain(smol_tokenizer(), ["xgrammar", "outlines"])
    with pytest.raises(BackendCannotCompile) as info:
        chain.compile(Constraint.json_schema(KEYWORD_PROBES["not"][0]))
    assert "xgrammar: does not enforce not" in info.value.message
    assert "outlines: does not enforce not" in info.value.message
    assert info.value.param == "response_format" and info.value.status == 400


@pytest.mark.parametrize("fmt", ["idn-email", "idn-hostname", "iri", "iri-reference", "regex"])
def test_a_format_no_backend_enforces_leaves_the_chain(fmt):
    """llguidance refuses these formats, and xgrammar compiled them as any string, recorded
    as the backend that enforced them (the output check, which asserts them, then failed).
    Now every backend refuses, and the embedded engine takes the post-hoc path. A format
    the check does not know is an annotation: xgrammar's any string enforces it."""
    chain = BackendChain(smol_tokenizer())
    schema = {"type": "object", "properties": {"a": {"type": "string", "format": fmt}}}
    with pytest.raises(BackendCannotCompile) as info:
        chain.compile(Constraint.json_schema(schema))
    assert f"xgrammar: ignores format {fmt!r} at /properties/a" in info.value.message
    assert [f"{name}: " in info.value.message for name in chain.names] == [True] * 3
    annotated = Constraint.json_schema({"type": "string", "format": "password"})
    assert chain.compile(annotated).backend == "xgrammar"


def test_the_default_chain_builds_no_vocabulary_dfa_for_a_client():
    """420 bytes of schema that llguidance (overlapping oneOf) and xgrammar ((?s)) refuse
    cost Outlines minutes of CPU and gigabytes: by default it is a prompt 400 instead."""
    branch = lambda i, n: {
        "type": "object",
        "properties": {f"p{i}_{j}": {"type": "string", "format": "email"} for j in range(n)},
        "additionalProperties": False,
    }
    schema = {"oneOf": [branch(0, 3), branch(1, 3), {"type": "string", "pattern": "(?s)x"}]}
    chain = BackendChain(smol_tokenizer())
    started = time.monotonic()
    with pytest.raises(BackendCannotCompile) as info:
        chain.compile(Constraint.json_schema(schema))
    assert time.monotonic() - started < 10 and "outlines" not in info.value.message
    assert info.value.status == 400


def test_backend_order_configuration(monkeypatch):
    monkeypatch.setenv("CALLPROOF_BACKENDS", "xgrammar, llguidance")
    assert backend_order() == ["xgrammar", "llguidance"]
    assert backend_order("outlines") == ["outlines"]
    monkeypatch.delenv("CALLPROOF_BACKENDS")
    assert backend_order() == ["llguidance", "xgrammar", "lm-format-enforcer"]
    with pytest.raises(EngineConfigError, match="unknown grammar backend"):
        backend_order(["llguidance", "nosuch"])
    monkeypatch.setenv("CALLPROOF_BACKENDS", "llguidance,nosuch")
    with pytest.raises(EngineConfigError, match=r"^CALLPROOF_BACKENDS names unknown .*'nosuch'"):
        backend_order()


def test_property_names_and_values_are_not_keywords():
    """dependentRequired maps property names to lists of them; a property called "maximum"
    made Outlines refuse a schema with no bound in it."""
    schema = {
        "type": "object",
        "properties": {"maximum": {"type": "integer"}, "minimum": {"type": "integer"}},
        "dependentRequired": {"maximum": ["minimum"]},
        "enum": [{"maximum": 1, "minimum": 0}],
    }
    assert set(schema_keywords(schema)) == {"type", "properties", "dependentRequired", "enum"}


PETS = {
    "$defs": {
        "Cat": {
            "type": "object",
            "properties": {"kind": {"const": "cat"}, "lives": {"type": "integer"}},
            "required": ["kind"],
        },
        "Dog": {
            "type": "object",
            "properties": {"kind": {"const": "dog"}, "good": {"type": "boolean"}},
            "required": ["kind"],
        },
    },
}


@pytest.mark.parametrize(
    "schema, pointer",
    [
        ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "/oneOf"),  # 3 is both
        ({"oneOf": [{"type": "integer"}, {"type": ["string", "null"]}]}, None),
        ({"oneOf": [{"enum": [1, 2]}, {"enum": [True, 3]}]}, None),  # true is not 1 in JSON
        ({"oneOf": [{"enum": [1, 2]}, {"const": 2.0}]}, "/oneOf"),
        ({"oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}], **PETS}, None),
        (
            {"properties": {"p": {"oneOf": [{"type": "object"}, {"$ref": "#/$defs/Cat"}]}}, **PETS},
            "/properties/p/oneOf",
        ),
        (  # no type: a string matches both, whatever they require of objects
            {"oneOf": [{"required": ["a"]}, {"required": ["b"]}]},
            "/oneOf",
        ),
    ],
)
def test_one_of_branches_proven_disjoint(schema, pointer):
    assert overlapping_one_of(schema) == pointer


@pytest.mark.parametrize("name", ["xgrammar", "lm-format-enforcer", "outlines"])
def test_backends_reading_one_of_as_any_of_refuse_branches_that_may_overlap(name):
    """xgrammar compiled an overlapping oneOf as anyOf (saying so only on stderr) and the
    model wrote 3 for integer|number: a 422 on every request."""
    schema = {
        "type": "object",
        "properties": {"v": {"oneOf": [{"type": "integer"}, {"type": "number"}]}},
    }
    with pytest.raises(BackendCannotCompile, match="branches of /properties/v/oneOf may overlap"):
        make_backend(name, smol_tokenizer()).compile(Constraint.json_schema(schema))


def test_xgrammar_takes_a_one_of_whose_branches_are_disjoint():
    schema = {"oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}], **PETS}
    compiled = make_backend("xgrammar", smol_tokenizer()).compile(Constraint.json_schema(schema))
    assert matches(compiled.matcher(), '{"kind":"cat","lives":9}')
    assert not matches(compiled.matcher(), '{"kind":"cow"}')


@pytest.mark.parametrize(
    "constraint, reason",
    [
        (Constraint.regex("[0-9]{3}\\Z"), "reads the escape \\Z"),
        (Constraint.regex("\\A[0-9]+"), "reads the escape \\A"),
        (Constraint.regex("[\\101-\\132]{2}"), "reads the escape \\1"),
        (Constraint.regex("[\\p{Lu}][a-z]+"), "reads the escape \\p"),
        (Constraint.regex("\\x41B"), "reads \\x41 and the hex digit after it"),
        (Constraint.regex("(?i)abc"), "cannot read the group beginning '(?i)'"),
        (Constraint.regex("(?P<y>[0-9]{4})"), "cannot read the group beginning '(?P<'"),
        (
            Constraint.json_schema({"type": "string", "pattern": "^\\P{N}+$"}),
            "reads the escape \\P",
        ),
        (
            Constraint.json_schema({"type": "string", "pattern": "^a\\Z"}),
            "reads the escape \\Z",
        ),
        (Constraint.json_schema({"type": "number", "multipleOf": 5}), "ignores multipleOf at /"),
        (Constraint.json_schema({"type": "integer", "multipleOf": 2.5}), "ignores multipleOf"),
        (
            Constraint.json_schema({"type": "integer", "multipleOf": 10, "minimum": 0}),
            "ignores multipleOf",
        ),
        (
            Constraint.json_schema({"type": "string", "format": "date", "maxLength": 12}),
            "ignores minLength/maxLength",
        ),
        (
            Constraint.json_schema({"type": "string", "pattern": "^a+$", "minLength": 2}),
            "ignores minLength/maxLength",
        ),
        (
            Constraint.json_schema({"type": "string", "format": "idn-email"}),
            "ignores format 'idn-email' at /",
        ),
    ],
)
def test_xgrammar_refuses_what_it_would_weaken(constraint, reason):
    """What xgrammar drops in some combinations, or reads in another regex dialect, it
    reports only on stderr; the probes here are those warnings, each a 422 loop before."""
    with pytest.raises(BackendCannotCompile, match=f"^xgrammar: {re.escape(reason)}"):
        make_backend("xgrammar", smol_tokenizer()).compile(constraint)


UNICODE_NAME = {"type": "string", "pattern": "^\\p{Lu}[\\p{Ll}\\p{Mn}]{1,20}$"}


@pytest.mark.parametrize(
    "text, ok",
    [
        ('"Zoë"', True),
        ('"Émile"', True),
        ('"Åsa"', True),
        ('"zoë"', False),
        ('"Zo3"', False),
        ('"Z"', False),
        ('"p{Lu}"', False),
    ],
)
def test_llguidance_enforces_unicode_property_escapes(text, ok):
    """JSON Schema patterns are ECMA regexes, where \\p{L} means a letter of any script."""
    compiled = make_backend("llguidance", smol_tokenizer()).compile(
        Constraint.json_schema(UNICODE_NAME)
    )
    assert matches(compiled.matcher(), text) is ok


@pytest.mark.parametrize("name", ["xgrammar", "lm-format-enforcer"])
def test_backends_without_unicode_properties_refuse_them(name):
    """xgrammar read \\p inside a class as the letter p; neither may enforce less."""
    with pytest.raises(BackendCannotCompile):
        make_backend(name, smol_tokenizer()).compile(Constraint.json_schema(UNICODE_NAME))


def test_xgrammar_enforces_multiple_of_on_whole_integer_steps():
    compiled = make_backend("xgrammar", smol_tokenizer()).compile(
        Constraint.json_schema({"type": "integer", "multipleOf": 5})
    )
    assert matches(compiled.matcher(), "10") and not matches(compiled.matcher(), "7")


def test_a_constraint_past_llguidances_compile_bounds_is_refused_not_handed_on():
    """llguidance's lexer fuel bounds what a compile may cost; xgrammar, next in the chain,
    has no bound and took 6 s (13 s under load) for this 999-character regex, on each new
    text. A feature llguidance lacks still falls through (possessive quantifiers aside, a
    format xgrammar enforces: the backend tests above). max_regex_loops refuses these
    before any backend sees them; raised here, llguidance's bound is what is left."""
    chain = BackendChain(smol_tokenizer(), limits=Limits(max_regex_loops=1000))
    for constraint in (
        Constraint.regex(".*" * 499 + "b"),
        Constraint.json_schema({"type": "string", "pattern": ".*" * 499 + "b"}),
    ):
        started = time.perf_counter()
        with pytest.raises(ConstraintTooComplex, match="too costly to compile") as info:
            chain.compile(constraint)
        assert time.perf_counter() - started < 3.0
        assert info.value.status == 400 and info.value.param == constraint.param
