"""Bad constraints fail fast with a typed error naming the problem, before any backend runs."""

from __future__ import annotations

import json
import time

import pytest
import torch
from grammar_testkit import compiled, smol_tokenizer

from runtime.backends import BackendChain, make_backend
from runtime.constrained import ConstrainedLogitsProcessor, GrammarViolation
from runtime.constraint import Constraint
from runtime.errors import (
    BackendCannotCompile,
    ConstraintTooComplex,
    ConstraintUnsatisfiable,
    InvalidGrammar,
    InvalidRegex,
    InvalidSchema,
    RuntimeInputError,
)
from runtime.limits import Limits, check_constraint, check_tool_count


@pytest.fixture(scope="module")
def chain():
    built = BackendChain(smol_tokenizer())
    built.compile(Constraint.regex("warm"))  # builds the first backend: not part of any timing
    return built


def _deep(levels: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"x": schema}}
    return schema


@pytest.mark.parametrize(
    "constraint, error, words",
    [
        (Constraint.json_schema({"type": "objekt"}), InvalidSchema, "/type"),
        (
            Constraint.json_schema({"type": "object", "properties": {"a": {"minLength": -1}}}),
            InvalidSchema,
            "/properties/a/minLength",
        ),
        (Constraint.json_schema({"required": "a"}), InvalidSchema, "/required"),
        (Constraint.regex("a(b"), InvalidRegex, "missing ), unterminated subpattern"),
        (Constraint.regex("[z-a]"), InvalidRegex, "bad character range"),
        # a set operation to llguidance's Rust regex, two characters to Python and ECMA
        (Constraint.regex("[a-z&&[^aeiou]]{3}"), InvalidRegex, "'&&' inside a character class"),
        (Constraint.regex("[[:alpha:]]+"), InvalidRegex, "'[' inside a character class"),
        (
            Constraint.json_schema({"type": "string", "pattern": "^[a-z--x]$"}),
            InvalidRegex,
            "'--' inside a character class",
        ),
        (  # read before any limit: it must not skip them (a class hid (x{1000}){1000})
            Constraint.ebnf(
                'start: %json {"type": "string", "pattern": "[a[:b:]](x{1000}){1000}"}'
            ),
            InvalidRegex,
            "'[' inside a character class",
        ),
        # Unicode property escapes: their names checked, their repetitions limited
        (Constraint.regex("\\p{Letterz}+"), InvalidRegex, "an unknown Unicode property"),
        (
            Constraint.json_schema({"type": "string", "pattern": "^\\p{Script=Klingon}$"}),
            InvalidSchema,
            "an unknown Unicode property",
        ),
        # known to the regex module only (the output check), not to llguidance's Rust regex
        (Constraint.regex("\\p{InGreek}+"), InvalidRegex, "an unknown Unicode property"),
        # "not Greek" to jsonschema-rs, "Greek" to llguidance, nothing to the regex module
        (Constraint.regex("\\p{Script!=Greek}"), InvalidRegex, "not of the form"),
        (Constraint.regex("\\p{L"), InvalidRegex, "not of the form"),
        (Constraint.regex("(\\p{L}+)+!"), ConstraintTooComplex, "nested quantifier"),
        # a property no sample character has, negated; a "[" in a verbose-mode comment
        (Constraint.regex("([^\\p{Cherokee}]+)+!"), ConstraintTooComplex, "nested quantifier"),
        (Constraint.regex("(?x)#[\n(\\p{L}+)+!"), ConstraintTooComplex, "nested quantifier"),
        (Constraint.regex("\\P{N}{5000}"), ConstraintTooComplex, "max_regex_repeat"),
        (Constraint.ebnf("start: foo"), InvalidGrammar, "unknown name"),
        (Constraint.ebnf('start: "a" ('), InvalidGrammar, "invalid grammar"),
        (Constraint.ebnf("  "), InvalidGrammar, "empty"),
        (Constraint.ebnf("root ::= [a-"), InvalidGrammar, "invalid grammar"),
        (Constraint.ebnf('foo ::= "a"'), InvalidGrammar, "No 'root' rule"),
        (Constraint.ebnf("root ::= foo"), InvalidGrammar, "Rule 'foo' not found"),
        (Constraint.regex("(a+)+$"), ConstraintTooComplex, "nested quantifier"),
        (Constraint.regex("((a+))+b"), ConstraintTooComplex, "nested quantifier"),
        (Constraint.regex("(a+|b)+c"), ConstraintTooComplex, "nested quantifier"),
        (Constraint.regex(r"^(\w+\s?)*$"), ConstraintTooComplex, "nested quantifier"),
        (Constraint.regex(r"\d{5000}"), ConstraintTooComplex, "max_regex_repeat"),
        (Constraint.regex("a{,100000}"), ConstraintTooComplex, "max_regex_repeat"),
        (Constraint.regex("((a{100})b){100}"), ConstraintTooComplex, "10100 copies"),
        (Constraint.regex("a{999}" * 3), ConstraintTooComplex, "2997 copies"),
        (
            Constraint.json_schema({"type": "string", "pattern": "^a{,100000}$"}),
            ConstraintTooComplex,
            "max_regex_repeat",
        ),
        (
            Constraint.json_schema({"patternProperties": {"(x+)+": {}}}),
            ConstraintTooComplex,
            "nested quantifier",
        ),
        (Constraint.regex("a" * 2000), ConstraintTooComplex, "max_regex_length"),
        (Constraint.ebnf('start: "a"~100000'), ConstraintTooComplex, "100000 copies"),
        (Constraint.ebnf('start: b ~ 10..600 b~500\nb: "x"'), ConstraintTooComplex, "1100"),
        (Constraint.ebnf('start: "a"{100000}'), ConstraintTooComplex, "max_regex_repeat"),
        (Constraint.ebnf('root ::= "a"{100000}'), ConstraintTooComplex, "max_regex_repeat"),
        (Constraint.ebnf('start: ((("a"~40)~40)~40)'), ConstraintTooComplex, "65640 copies"),
        (Constraint.ebnf('start: "a"~' + "9" * 5000), ConstraintTooComplex, "max_regex_repeat"),
        (Constraint.ebnf("start: /(a{1000}){1000}/"), ConstraintTooComplex, "max_regex_repeat"),
        (Constraint.json_schema(_deep(40)), ConstraintTooComplex, "max_schema_depth"),
        (
            Constraint.ebnf("start: r0\n" + "\n".join(f"r{i}: (r{i + 1})" for i in range(200))),
            ConstraintTooComplex,
            "nests 399 levels deep",
        ),
        (
            Constraint.ebnf("start: %json " + json.dumps(_deep(40))),
            ConstraintTooComplex,
            "%json schema in the grammar nests",
        ),
        (
            Constraint.json_schema(
                {
                    "$defs": {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(80)},
                    "$ref": "#/$defs/d0",
                }
            ),
            ConstraintTooComplex,
            "with its $refs followed",
        ),
        (
            Constraint.json_schema({"enum": ["x" * 100] * 1000}),
            ConstraintTooComplex,
            "max_schema_bytes",
        ),
    ],
)
def test_typed_error_fast(chain, constraint, error, words):
    start = time.perf_counter()
    with pytest.raises(error) as info:
        chain.compile(constraint)
    assert time.perf_counter() - start < 0.5
    assert words in info.value.message
    assert isinstance(info.value, RuntimeInputError) and info.value.status == 400
    assert (
        info.value.param
        == {"json": "response_format", "regex": "regex", "ebnf": "grammar"}[constraint.kind]
    )


def _chain(rule: str, count: int = 300) -> str:
    """``count`` rules each naming the next, written as ``rule`` ({i} and {j} the names)."""
    rules = "\n".join(rule.format(i=i, j=i + 1) for i in range(count))
    return "start: r0\n" + rules + f'\nr{count}: "a"'


@pytest.mark.parametrize(
    "grammar",
    [
        _chain("r{i}: r{j}"),
        _chain('r{i}: /"/ r{j} /"/'),  # a quote in a regex literal
        _chain("r{i}: /x\\// r{j}"),  # an escaped slash
        _chain('r{i}: "%json {{" r{j} "}}"'),  # %json inside a string
        _chain("r{i}: r{j}").replace("start: r0", "start: r0\n# %json {"),  # in a # comment
        _chain("r{i}: /x/r{j}"),  # a regex's flags end at its last flag letter
        _chain('r{i}: <"> r{j} <">'),  # a special token holding a quote
        _chain("r{i}: /a\n/ r{j}"),  # a regex literal across a line break
        _chain("!?r{i}: r{j}"),
        _chain("r{i}.+1: r{j}"),
        _chain('r{i}: r-{i} "b"\nr-{i}: r{j}'),  # names with a hyphen
    ],
    ids=[
        "plain",
        "quote-in-regex",
        "escaped-slash",
        "json-in-string",
        "hash-comment",
        "regex-flags",
        "special-token",
        "multiline-regex",
        "prefixes",
        "priority",
        "hyphens",
    ],
)
def test_a_rule_chain_is_measured_however_it_is_written(grammar: str) -> None:
    """Each spelling hid the chain from the depth check in a first version; llguidance reads
    them all, and a chain of 3,000 overflows an 8 MB stack."""
    with pytest.raises(ConstraintTooComplex, match="max_grammar_depth"):
        check_constraint(Constraint.ebnf(grammar))


@pytest.mark.parametrize(
    "grammar",
    ['start: "' + '\\"' * 30000, "start: /" + "\\/" * 30000, "start: a\n" + "%json{" * 9000],
    ids=["unclosed-string", "unclosed-regex", "unclosed-json"],
)
def test_reading_a_grammar_that_never_closes_is_linear(grammar: str) -> None:
    """Scanning on from every quote of an unclosed string took a minute for 64 KB."""
    started = time.perf_counter()
    try:
        check_constraint(Constraint.ebnf(grammar))
    except ConstraintTooComplex:
        pass
    assert time.perf_counter() - started < 1.0


def test_a_repetition_bound_past_python_s_maximum_is_too_complex() -> None:
    with pytest.raises(ConstraintTooComplex, match="past 2\\*\\*32"):
        check_constraint(Constraint.regex("a{4294967296}"))
    with pytest.raises(ConstraintTooComplex, match="past 2\\*\\*32"):
        check_constraint(Constraint.json_schema({"type": "string", "pattern": "a{4294967296}"}))


@pytest.mark.parametrize(
    ("constraint", "feature"),
    [
        (Constraint.regex("(?=a)a"), "a lookahead or lookbehind"),
        (Constraint.regex("x(a|(?!b)c)*"), "a lookahead or lookbehind"),
        (
            Constraint.json_schema({"type": "string", "pattern": "^(?=a)[a-z]+$"}),
            "a lookahead or lookbehind",
        ),
        (Constraint.json_schema({"type": "string", "pattern": "\\bfoo\\b"}), "a word boundary"),
        (Constraint.json_schema({"type": "string", "pattern": "^(a)\\1$"}), "a backreference"),
        (Constraint.regex("[ab]++b"), "a possessive quantifier"),
        (
            Constraint.json_schema({"type": "string", "pattern": "^[0-9]{1,2}+[0-9]$"}),
            "a possessive quantifier",
        ),
    ],
    ids=[
        "regex",
        "nested",
        "schema-lookahead",
        "schema-word-boundary",
        "schema-backreference",
        "possessive",
        "schema-possessive",
    ],
)
def test_no_backend_takes_what_an_automaton_cannot_enforce(chain, constraint, feature):
    """lm-format-enforcer dropped a regex's lookahead silently, and xgrammar a schema
    pattern's, so the output ignored it; lm-format-enforcer took a schema pattern's \\b and
    crashed mid-decode; llguidance enforced a possessive quantifier as a greedy one. Every
    backend now refuses them (a JSON schema then takes the post-hoc path, whose validator
    does enforce them)."""
    with pytest.raises(BackendCannotCompile) as info:
        chain.compile(constraint)
    for name in chain.names:
        assert f"{name}: " in info.value.message
    assert info.value.message.count(f"uses {feature}") == len(chain.names)
    assert info.value.status == 400


@pytest.mark.parametrize("value", [float("nan"), float("-inf")], ids=["nan", "infinity"])
def test_a_schema_json_cannot_carry_is_refused_not_rewritten(value: float) -> None:
    """msgspec would write NaN and infinities as null: a different schema, silently."""
    with pytest.raises(InvalidSchema, match="not JSON"):
        Constraint.json_schema({"type": "number", "maximum": value})
    assert Constraint.json_schema({"type": ["number", "null"]}).schema() == {
        "type": ["number", "null"]
    }


def test_compiling_through_the_cache_raises_the_same_typed_errors():
    with pytest.raises(InvalidSchema):
        compiled(Constraint.json_schema({"type": 5}))
    with pytest.raises(InvalidRegex):
        compiled(Constraint.regex("("))
    with pytest.raises(InvalidGrammar):
        compiled(Constraint.ebnf("start: ("))


@pytest.mark.parametrize(
    ("schema", "why"),
    [
        ({"type": "object", "properties": {"a": {"enum": []}}, "required": ["a"]}, "'a'"),
        ({"type": "string", "minLength": 5, "maxLength": 2}, "maxLength"),
    ],
    ids=["empty-enum", "min-over-max"],
)
def test_a_schema_that_admits_no_value_is_refused_before_decoding(schema, why) -> None:
    """llguidance proves it; falling through, lm-format-enforcer crashed on such schemas and
    the post-hoc path decoded for seconds, to a 422 blaming the model."""
    with pytest.raises(ConstraintUnsatisfiable) as err:
        compiled(Constraint.json_schema(schema))
    assert err.value.param == "response_format" and err.value.status == 400
    assert "admits no value" in err.value.message and why in err.value.message


def test_a_union_whose_refs_do_not_resolve_never_reaches_a_backend(chain) -> None:
    """A tool union as a root ``$id`` kept in it once made it: llguidance refused it,
    xgrammar compiled it anyway, and the output check, unable to build, raised after
    decoding (a 500). The whole union's validator is built first now: a 400 naming where."""
    union = {
        "type": "object",
        "properties": {"tool": {"const": "f"}, "arguments": {"$ref": "#/$defs/tool-f"}},
        "required": ["tool", "arguments"],
        "additionalProperties": False,
        "$defs": {
            "tool-f": {
                "$id": "https://example.com/f",
                "type": "object",
                "properties": {"pet": {"$ref": "#/$defs/tool-f/$defs/Pet"}},
                "required": ["pet"],
                "$defs": {"Pet": {"type": "string"}},
            }
        },
    }
    with pytest.raises(InvalidSchema) as err:
        chain.compile(Constraint.json_schema(union, kind="tools"))
    assert err.value.param == "tools" and err.value.status == 400
    assert "'/$defs/tool-f/$defs/Pet' does not exist" in err.value.message


def test_limits_are_configurable_and_name_the_limit():
    small = Limits(max_schema_bytes=10, max_tools=2, max_regex_length=3)
    with pytest.raises(ConstraintTooComplex, match="max_schema_bytes is 10"):
        check_constraint(Constraint.json_schema({"type": "string"}), small)
    with pytest.raises(ConstraintTooComplex, match="max_regex_length is 3"):
        check_constraint(Constraint.regex("abcd"), small)
    with pytest.raises(ConstraintTooComplex, match="max_tools is 2") as info:
        check_tool_count(3, small)
    assert info.value.param == "tools"
    check_tool_count(2, small)
    check_constraint(Constraint.regex(r"(ab)+\d{3}-[a-z]{1,10}"))  # ordinary patterns pass


def test_repetitions_inside_literals_and_comments_are_not_counted():
    check_constraint(Constraint.ebnf('start: "~ 5000" /a~9000/ "b"~5 // x ~ 7000\n'))


def test_a_grammar_over_the_backends_own_limit_while_decoding_is_a_400_not_a_fault():
    """llguidance gives up on its own grammar past 50,000 parser items (here: a repetition
    the static limit would refuse, compiled directly to reach the decode-time check)."""
    tok = smol_tokenizer()
    constraint = Constraint.ebnf('start: "a"~100000')
    compiled = make_backend("llguidance", tok).compile(constraint)
    processor = ConstrainedLogitsProcessor(compiled.matcher(), tok, param=constraint.param)
    scores = torch.zeros((1, len(tok)))
    masked = processor(torch.tensor([[1]]), scores)
    token = int(masked[0].argmax())
    with pytest.raises(ConstraintTooComplex) as info:
        processor(torch.tensor([[1, token]]), scores)
    assert "Too many items" in info.value.message and info.value.param == "grammar"
    assert info.value.status == 400
    ordinary = make_backend("llguidance", tok).compile(Constraint.ebnf('start: "a"'))
    processor = ConstrainedLogitsProcessor(ordinary.matcher(), tok, param="grammar")
    processor(torch.tensor([[1]]), scores)
    refused = tok.encode("zzz", add_special_tokens=False)[0]  # a token its mask forbade
    with pytest.raises(GrammarViolation):  # a masking bug stays an engine fault (500)
        processor(torch.tensor([[1, refused]]), scores)


@pytest.mark.parametrize(
    "constraint",
    [
        Constraint.ebnf('root ::= "<|im_start|>" "b"'),
        Constraint.ebnf('start: "<|im" "_start|>"'),
        Constraint.regex(r"<\|im_end\|>b"),
        Constraint.json_schema({"const": "<|endoftext|>"}),
    ],
    ids=["gbnf-literal", "split-literal", "regex", "json-const"],
)
def test_text_spelling_a_special_token_goes_to_a_backend_that_writes_it_as_text(
    constraint: Constraint,
) -> None:
    """llguidance forces such text as the special token itself, then refuses that token (an
    engine fault, 500, before); xgrammar writes it as ordinary text tokens."""
    tok = smol_tokenizer()
    with pytest.raises(BackendCannotCompile, match="spells the special token"):
        make_backend("llguidance", tok).compile(constraint)
    assert BackendChain(tok).compile(constraint).backend == "xgrammar"


def test_a_special_token_llguidance_would_force_anyway_is_a_400_not_a_fault() -> None:
    """Spelled across two rules the source check misses it: the mask offers no special
    token, so the constraint allows nothing next, a 400 naming it."""
    tok = smol_tokenizer()
    constraint = Constraint.ebnf('start: a b\na: "<|im"\nb: "_start|>"')
    compiled = make_backend("llguidance", tok).compile(constraint)
    processor = ConstrainedLogitsProcessor(compiled.matcher(), tok, param="grammar")
    with pytest.raises(ConstraintUnsatisfiable) as info:
        processor(torch.tensor([[5]]), torch.zeros((1, len(tok))))
    assert info.value.param == "grammar" and "special token" in info.value.message


@pytest.mark.parametrize(
    "pattern",
    [r"^\d+(\.\d+)*$", r"^[a-z0-9]+(-[a-z0-9]+)*$", r"^([0-9a-f]{2})+$", r"([^,]+,)*", r"(\d+\.)+"],
)
def test_nesting_that_cannot_split_its_input_two_ways_passes(pattern: str) -> None:
    """Semver, slugs, hex pairs, CSV cells: nested, but each iteration starts with what the
    inner repetition cannot take (or counts exactly), so there is one way to match."""
    check_constraint(Constraint.regex(pattern))
    check_constraint(Constraint.json_schema({"type": "string", "pattern": pattern}))
