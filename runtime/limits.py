"""Limits on what a request may ask the grammar compiler to do.

A schema or regex is attacker-controlled input to a compiler that runs on the serving host;
these checks are cheap and run before any compile, so an oversized or pathological constraint
costs a 400, not a stalled worker. Each error names the limit it broke.
"""

from __future__ import annotations

import re
import re._constants as re_constants
import re._parser as re_parser
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import msgspec

from runtime.bounded_cache import size_bounded
from runtime.constraint import Constraint, to_lark
from runtime.errors import ConstraintTooComplex, InvalidRegex
from runtime.redos import REPEATS, ambiguous_repeat
from runtime.unicode_properties import property_error, python_form


@dataclass(frozen=True)
class Limits:
    max_schema_bytes: int = 64 * 1024
    max_schema_depth: int = 64  # JSON nesting of the schema document (about 2 per level)
    max_tools: int = 64
    max_regex_length: int = 1024
    max_regex_repeat: int = 1000  # copies all counted repetitions ask for, summed (nested multiply)
    max_grammar_bytes: int = 64 * 1024
    # Rule references followed from the start rule, each weighted by the ( and [ around it:
    # llguidance recurses through them, and about 2,000 of them overflow a thread's stack.
    max_grammar_depth: int = 256


DEFAULT_LIMITS = Limits()


def _source_size(constraint: Constraint, limits: Limits = DEFAULT_LIMITS) -> int:
    return len(constraint.source)


@size_bounded(_source_size, max_entries=4096, max_bytes=16 << 20)
def check_constraint(constraint: Constraint, limits: Limits = DEFAULT_LIMITS) -> None:
    """Raise ConstraintTooComplex when the constraint is over a limit. Every request checks
    its constraint and agents resend the same tools, so a constraint that passed is
    remembered (one that fails raises, which the memo does not keep)."""
    param = constraint.param
    if constraint.is_json:
        what = (
            "the tools' union schema (every tool's parameters together, as enforced)"
            if constraint.kind == "tools"
            else None
        )
        _check_schema(constraint.source.encode(), limits, param, what)
    elif constraint.kind == "regex":
        check_regex(constraint.source, limits)
    else:
        size = len(constraint.source.encode())
        if size > limits.max_grammar_bytes:
            raise ConstraintTooComplex(
                f"grammar is {size} bytes; max_grammar_bytes is {limits.max_grammar_bytes}",
                param=param,
            )
        lark = _lark_or_none(constraint.source)
        lexed = _lex(lark or constraint.source)  # read once for the three checks below
        copies = grammar_repeat_copies(lexed)
        if copies > limits.max_regex_repeat:
            raise ConstraintTooComplex(
                f"grammar asks for {copies} copies of items (its ~ repetitions, summed);"
                f" max_regex_repeat is {limits.max_regex_repeat}",
                param=param,
            )
        if lark is None:
            return  # not a grammar at all: validation says why
        for text in lexed.schemas:
            _check_schema(text, limits, param, what="%json schema in the grammar")
        depth = grammar_depth(lexed)
        if depth > limits.max_grammar_depth:
            raise ConstraintTooComplex(
                f"grammar nests {depth} levels deep (rule references followed from its start"
                f" rule, weighted by the groups around them); max_grammar_depth is"
                f" {limits.max_grammar_depth}",
                param=param,
            )


def check_schema_bounds(text: bytes, limits: Limits, param: str, what: str | None = None) -> None:
    """The size and depth limits alone, on a schema's JSON text: cheap, so they run before a
    schema is checked against its metaschema or cached (a 1 MB schema took 27 s to check,
    and was kept). The depth of a text is remembered: agents resend the same tools.
    ``what`` names the schema in the error (default: ``param``, quoted)."""
    what = what or f"'{param}'"
    if len(text) > limits.max_schema_bytes:
        raise ConstraintTooComplex(
            f"{what} is {len(text)} bytes; max_schema_bytes is {limits.max_schema_bytes}",
            param=param,
        )
    depth = _depth_of_text(text)
    if depth > limits.max_schema_depth:
        deep = "too deep to read" if depth == _TOO_DEEP else f"{depth} levels deep"
        raise ConstraintTooComplex(
            f"{what} nests {deep} with its $refs followed; max_schema_depth is"
            f" {limits.max_schema_depth}",
            param=param,
        )


_TOO_DEEP = 10**9


@size_bounded(len, max_entries=1024, max_bytes=16 << 20)  # texts within max_schema_bytes only
def _depth_of_text(text: bytes) -> int:
    try:
        return schema_depth(msgspec.json.decode(text))
    except RecursionError:
        return _TOO_DEEP
    except msgspec.DecodeError:
        return 0  # a %json block that is not JSON: validation says why


def _check_schema(text: bytes, limits: Limits, param: str, what: str | None = None) -> None:
    check_schema_bounds(text, limits, param, what)
    try:
        schema = msgspec.json.decode(text)
    except msgspec.DecodeError:
        return  # a %json block that is not JSON: validation says why
    for pattern in schema_patterns(schema):
        check_regex(pattern, limits, param)


# What a Lark grammar holds that is not grammar syntax, read left to right in one pass as
# llguidance's lexer reads it (a quote inside a regex literal, or a "//" or "%json {" inside
# a string, is not one): comments (// and #), strings ("..." with an i flag), regex literals
# (/.../ with llguidance's flags; they may span lines), special tokens (<...>), and the
# JSON schema after a %json directive. A string or regex that never closes ends the scan:
# the grammar is invalid (validation says why), and scanning on from every quote in it
# would take quadratic time.
_LARK_START = re.compile(r'//|[#"/<]|%json\s*(?=\{)')
_LARK_COMMENT = re.compile(r"(?://|#)[^\n]*")
_LARK_STRING = re.compile(r'"(?:[^"\\\n]|\\.)*"i?')
_LARK_REGEX = re.compile(r"/(?:[^/\\]|\\.)+/[imslux]*")
_LARK_SPECIAL = re.compile(r"<[^<>\n]*>")


@dataclass(frozen=True)
class _Lexed:
    bare: str  # the grammar with comments dropped and each literal or schema emptied
    regexes: tuple[str, ...]  # the patterns of its regex literals
    schemas: tuple[bytes, ...]  # the JSON texts of its %json schemas


def _lex(lark: str) -> _Lexed:
    parts: list[str] = []
    regexes: list[str] = []
    schemas: list[bytes] = []
    at = 0
    while (start := _LARK_START.search(lark, at)) is not None:
        parts.append(lark[at : start.start()])
        token, at = start.group(), start.start()
        if token in ("//", "#"):
            at = _LARK_COMMENT.match(lark, at).end()  # type: ignore[union-attr]
        elif token == "<":
            special = _LARK_SPECIAL.match(lark, at)
            parts.append("<>" if special else "<")
            at = special.end() if special else at + 1
        elif token in ('"', "/"):
            literal = (_LARK_STRING if token == '"' else _LARK_REGEX).match(lark, at)
            if literal is None:
                break  # never closes
            if token == "/":
                regexes.append(literal.group()[1 : literal.group().rindex("/")])
            parts.append('""' if token == '"' else "/x/")
            at = literal.end()
        else:  # %json
            end = _json_end(lark, start.end())
            if end is None:
                break  # never closes
            schemas.append(lark[start.end() : end].encode())
            parts.append("%json {}")
            at = end
    else:
        parts.append(lark[at:])
    return _Lexed("".join(parts), tuple(regexes), tuple(schemas))


# item ~ n, item ~ m..n, item{n}, item{m,n}: the upper bound (or the lower, when open)
_GRAMMAR_REPEAT = re.compile(r"~\s*(\d+)(?:\s*\.\.\s*(\d+))?|\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")
_HUGE = 10**9  # a bound written with more digits counts as this (int() of 5,000 digits fails)
_GRAMMAR_PAREN = re.compile(r"[()]")
_SPACES = re.compile(r"\s*")


def grammar_repeat_copies(lexed: _Lexed) -> int:
    """Items a Lark grammar's counted repetitions ask for: each bound times the bounds of the
    groups around it, summed (``("a"~40)~40`` is 40 x 40 + 40). llguidance expands each
    into that many items (and gives up past 50,000 while decoding); the counted repetitions
    inside /regex/ terminals add up as in a regex. GBNF is read in its Lark form.
    Repetitions of a rule by another rule are not multiplied."""
    bare = lexed.bare
    regex_copies = sum(repeated_copies(pattern) for pattern in lexed.regexes)
    bound_at = {m.start(): _repeat_bound(m) for m in _GRAMMAR_REPEAT.finditer(bare)}
    parens = [(m.start(), m.group()) for m in _GRAMMAR_PAREN.finditer(bare)]
    group_bound: dict[int, int] = {}  # where a group opens -> the bound repeating it
    opened: list[int] = []
    for at, paren in parens:
        if paren == "(":
            opened.append(at)
        elif opened:
            group_bound[opened.pop()] = bound_at.get(_SPACES.match(bare, at + 1).end(), 1)
    # One pass in text order: the product of the bounds of the groups around each repetition.
    total, scale = regex_copies, [1]  # the {m,n} inside /regex/ terminals are not multiplied
    events = sorted([*parens, *((at, "") for at in bound_at)])
    for at, paren in events:
        if paren == "(":
            scale.append(min(scale[-1] * group_bound.get(at, 1), _HUGE))
        elif paren == ")":
            if len(scale) > 1:
                scale.pop()
        else:
            total += bound_at[at] * scale[-1]
    return total


def _lark_or_none(grammar: str) -> str | None:
    try:
        return to_lark(grammar)
    except ValueError:
        return None


def _json_end(text: str, start: int) -> int | None:
    """Where the JSON value at ``start`` ends; None when there is none (validation says
    why). Found without building it: one nested thousands deep would overflow the parser."""
    depth, at, in_string = 0, start, False
    while at < len(text):
        char = text[at]
        if in_string:
            if char == "\\":
                at += 1
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
            if depth == 0:
                return at + 1
        at += 1
    return None


# A rule or terminal definition at the start of a line: name, optional template parameters
# or priority, then the colon.
_GRAMMAR_RULE = re.compile(
    r"^[ \t]*[?!]*([A-Za-z_][A-Za-z0-9_-]*)[ \t]*(?:\{[^}\n]*\})?[ \t]*(?:\.[ \t]*[+-]?\d+)?[ \t]*:",
    re.MULTILINE,
)
_GRAMMAR_TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*|[()\[\]]")  # names may hold "-"


def grammar_depth(lexed: _Lexed) -> int:
    """How deep a Lark grammar nests: the longest chain of rule references from ``start``
    (from every rule when there is none), each reference weighted 1 plus the groups
    (``(...)``, ``[...]``) around it in its rule. A recursive rule counts once. Read without
    strings, regexes, comments and embedded schemas (:func:`_lex`); iterative, as deep
    input must not blow this process's stack either."""
    bare = lexed.bare
    definitions = list(_GRAMMAR_RULE.finditer(bare))
    bodies: dict[str, str] = {}
    for i, match in enumerate(definitions):
        end = definitions[i + 1].start() if i + 1 < len(definitions) else len(bare)
        bodies[match.group(1)] = bodies.get(match.group(1), "") + " " + bare[match.end() : end]
    edges: dict[str, list[tuple[str, int]]] = {}
    for name, body in bodies.items():
        nesting, refs = 0, []
        for token in _GRAMMAR_TOKEN.findall(body):
            if token in "([":
                nesting += 1
            elif token in ")]":
                nesting = max(nesting - 1, 0)
            elif token in bodies:
                refs.append((token, 1 + nesting))
        edges[name] = refs
    roots = ["start"] if "start" in bodies else list(bodies)
    done: dict[str, int] = {}  # shared: each rule is measured once whichever root reaches it
    return max((_longest_path(root, edges, done) for root in roots), default=0)


def _longest_path(root: str, edges: dict[str, list[tuple[str, int]]], done: dict[str, int]) -> int:
    """The heaviest path from ``root`` along weighted edges, cycles cut (memoised, iterative
    post-order: frames of node, edges left, heaviest path below, weight of the edge in)."""
    if root in done:
        return done[root]
    on_path = {root}
    stack: list[list[Any]] = [[root, iter(edges[root]), 0, 0]]
    while stack:
        frame = stack[-1]
        for target, weight in frame[1]:
            if target in done:
                frame[2] = max(frame[2], weight + done[target])
            elif target not in on_path:
                on_path.add(target)
                stack.append([target, iter(edges[target]), 0, weight])
                break
        else:
            stack.pop()
            on_path.discard(frame[0])
            done[frame[0]] = frame[2]
            if stack:
                stack[-1][2] = max(stack[-1][2], frame[3] + frame[2])
    return done[root]


def _repeat_bound(match: re.Match[str]) -> int:
    digits = [d for d in match.groups() if d]
    if any(len(d) > 9 for d in digits):
        return _HUGE
    low_tilde, high_tilde, low_brace, high_brace = match.groups()
    if low_tilde is not None:
        return int(high_tilde or low_tilde)
    return int(high_brace or low_brace)


def check_tool_count(count: int, limits: Limits = DEFAULT_LIMITS) -> None:
    if count > limits.max_tools:
        raise ConstraintTooComplex(f"{count} tools; max_tools is {limits.max_tools}", param="tools")


def schema_depth(schema: Any) -> int:
    """Nesting depth of a JSON schema with its local ``$ref``s followed (a target counts as a
    level below its $ref): a chain of ``$defs`` nests as deep as the schema written out, and
    the compilers recurse through it (1,500 linked $defs crash llguidance). A cycle (a
    recursive schema) is cut where it comes back to a node being measured, and every node
    is measured once however many pointers name it. Iterative: a deep schema must not blow
    this stack either."""
    done: dict[int, int] = {}  # id of a container -> its depth
    on_path: set[int] = {id(schema)}
    # frames: the node, its children left (containers, then its $ref), the deepest so far
    stack: list[list[Any]] = [[schema, _below(schema), 0]]
    depth = 0
    while stack:
        frame = stack[-1]
        for child in frame[1]:
            node = resolve_ref(schema, child) if isinstance(child, str) else child
            if node is None or id(node) in on_path:
                continue
            if id(node) in done:
                frame[2] = max(frame[2], done[id(node)])
                continue
            on_path.add(id(node))
            stack.append([node, _below(node), 0])
            break
        else:
            stack.pop()
            depth = frame[2] + 1
            on_path.discard(id(frame[0]))
            done[id(frame[0])] = depth
            if stack:
                stack[-1][2] = max(stack[-1][2], depth)
    return depth


def _below(node: Any) -> Iterator[Any]:
    """A JSON value's containers, then its local $ref (as the string) when it has one."""
    values = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
    yield from (v for v in values if isinstance(v, dict | list))
    if isinstance(node, dict) and isinstance(ref := node.get("$ref"), str) and ref.startswith("#"):
        yield ref


_INDEX = re.compile(r"0|[1-9][0-9]{0,8}")  # an array index in a JSON pointer (RFC 6901)


def resolve_ref(schema: Any, ref: str) -> Any:
    """The container a local JSON-pointer ``$ref`` (``#``, ``#/$defs/x``) names, or None."""
    node = schema
    if ref in ("#", "#/"):
        return node
    if not ref.startswith("#/"):
        return None  # an anchor: not followed
    for part in urllib.parse.unquote(ref[2:]).split("/"):  # a URI fragment (RFC 6901 s6)
        key = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and key in node:
            node = node[key]
        elif isinstance(node, list) and _INDEX.fullmatch(key) and int(key) < len(node):
            node = node[int(key)]
        else:
            return None
    return node if isinstance(node, dict | list) else None


# Keywords whose value is a map of name -> subschema (the names are not keywords).
SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


# Keywords whose value is data: instances, or property names (dependentRequired's keys).
DATA_KEYWORDS = frozenset({"enum", "const", "default", "examples", "dependentRequired"})


def schema_nodes(schema: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every object in the schema that is a (sub)schema, with its JSON pointer: not enum
    values, not the maps of names (``properties``, ``$defs``) that hold subschemas."""
    stack: list[tuple[str, Any]] = [("", schema)]
    while stack:
        pointer, node = stack.pop()
        if isinstance(node, list):
            stack.extend((f"{pointer}/{i}", item) for i, item in enumerate(node))
            continue
        if not isinstance(node, dict):
            continue
        yield pointer, node
        for key, value in node.items():
            at = f"{pointer}/{pointer_token(key)}"
            if key in DATA_KEYWORDS:
                continue
            if key in SCHEMA_MAPS and isinstance(value, dict):
                stack.extend((f"{at}/{pointer_token(name)}", sub) for name, sub in value.items())
            else:
                stack.append((at, value))


def schema_resources(
    schema: Any,
) -> tuple[list[tuple[str, str, dict[str, Any]]], dict[tuple[str, str], list[str]]]:
    """What Draft 2020-12 resolves a local ``$ref`` against: each schema object as (pointer,
    pointer of its resource, object), where the resource is the nearest object at or above
    it holding ``$id`` (the root otherwise) and ``#/...`` is a pointer from there; and the
    pointers holding each ``$anchor`` of each resource, which ``#name`` names."""
    nodes = list(schema_nodes(schema))
    roots = {pointer for pointer, node in nodes if "$id" in node} | {""}
    placed, anchors = [], {}
    for pointer, node in nodes:
        resource = pointer
        while resource not in roots:
            resource = resource.rpartition("/")[0]
        placed.append((pointer, resource, node))
        if isinstance(node.get("$anchor"), str):
            anchors.setdefault((resource, node["$anchor"]), []).append(pointer)
    return placed, anchors


def pointer_token(key: str) -> str:
    """``key`` as a JSON pointer reference token (RFC 6901: "~" is "~0", "/" is "~1")."""
    return key.replace("~", "~0").replace("/", "~1")


def schema_patterns(schema: Any) -> list[str]:
    """Every regex in a schema (``pattern`` values, ``patternProperties`` keys): the same
    compilers build automata from them as from a ``regex`` constraint."""
    found, stack = [], [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if isinstance(node.get("pattern"), str):
                found.append(node["pattern"])
            if isinstance(node.get("patternProperties"), dict):
                found.extend(node["patternProperties"])
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return found


def check_regex(pattern: str, limits: Limits = DEFAULT_LIMITS, param: str = "regex") -> None:
    """Reject long patterns, huge counted repetitions and nested quantifiers. The DFA-based
    backends do not backtrack, but counted repetitions and nested stars blow up their
    automata, and the output is checked again by a backtracking engine (under a deadline:
    runtime.planning)."""
    if len(pattern) > limits.max_regex_length:
        raise ConstraintTooComplex(
            f"regex is {len(pattern)} characters; max_regex_length is {limits.max_regex_length}",
            param=param,
        )
    ambiguous = _ambiguous_class(pattern)
    if ambiguous is not None:  # before Python's parser, which would warn on stderr
        raise InvalidRegex(f"the regex {pattern[:80]!r} has {ambiguous}", param=param)
    try:
        re_parser.parse(python_form(pattern).text)
    except OverflowError:
        raise ConstraintTooComplex(
            f"regex {pattern[:80]!r} has a repetition bound past 2**32", param=param
        ) from None
    except re.error:
        pass  # validation says why
    copies = repeated_copies(pattern)
    if copies > limits.max_regex_repeat:
        raise ConstraintTooComplex(
            f"regex {pattern[:80]!r} asks for {copies} copies of pieces (counted repetitions,"
            f" multiplied when nested, summed over the pattern); max_regex_repeat is"
            f" {limits.max_regex_repeat}",
            param=param,
        )
    if any(ambiguous_repeat(op, argument) for op, argument, _ in _regex_nodes(pattern)):
        raise ConstraintTooComplex(
            "regex has a nested quantifier that can split its input many ways (a repeated"
            " group ending in a repetition of the characters the group starts with, as in"
            " (a+)+ or (\\w+\\s?)*); rewrite it so the two cannot overlap",
            param=param,
        )


def repeated_copies(pattern: str) -> int:
    """How many copies of pieces the counted repetitions ask for, in total: each repetition's
    bound times the bounds around it (``(a{10}b){20}`` is 20 + 200), summed over the pattern
    (``a{999}`` written 150 times is 149,850, though no one bound is over the limit). Read
    from Python's own parse, so every spelling counts (``{n}``, ``{m,n}``, ``{,n}``,
    ``{n,}``); an unbounded ``*`` or ``+`` is a loop, not copies. 0 when Python cannot parse
    it (validation says why)."""
    return sum(
        copies * _bound(argument) for op, argument, copies in _regex_nodes(pattern) if op in REPEATS
    )


def constraint_patterns(constraint: Constraint) -> list[str]:
    """The regexes an automaton is built from: a regex constraint, or a JSON schema's
    patterns (none for a grammar, whose terminals its own parser reads)."""
    if constraint.kind == "regex":
        return [constraint.source]
    return schema_patterns(constraint.schema()) if constraint.is_json else []


_LOOKAROUNDS = (re_constants.ASSERT, re_constants.ASSERT_NOT)
_BACKREFERENCES = (re_constants.GROUPREF, re_constants.GROUPREF_EXISTS)
_WORD_BOUNDARIES = (re_constants.AT_BOUNDARY, re_constants.AT_NON_BOUNDARY)


def unenforceable_regex_feature(pattern: str) -> str | None:
    """The first thing in ``pattern`` that no grammar backend can enforce (each needs to
    look at text around the current position, which an automaton cannot), or None. Checked
    before any engine sees the regex, so the vLLM path refuses what the embedded one does."""
    for op, argument, _ in _regex_nodes(pattern):
        if op in _LOOKAROUNDS:
            return "a lookahead or lookbehind"
        if op in _BACKREFERENCES:
            return "a backreference"
        if op is re_constants.AT and argument in _WORD_BOUNDARIES:
            return "a word boundary (\\b or \\B)"
    return None


def regex_problem(pattern: str) -> str | None:
    """Why ``pattern`` cannot be a constraint's regex, or None: Python's ``re`` (what reads
    and limits every regex here) does not compile it, Unicode property escapes aside (their
    names are checked against the regex module and llguidance: runtime.unicode_properties),
    or it writes a character class that the decoders' engines read one way and the output
    checks another."""
    ambiguous = _ambiguous_class(pattern)  # first: Python warns on some of these
    if ambiguous is not None:
        return ambiguous
    error = property_error(pattern)
    if error is not None:
        return error
    form = python_form(pattern)
    try:
        re.compile(form.text)
    except (re.error, OverflowError) as exc:  # OverflowError: a bound past 2**32
        return f"does not compile: {form.restore(str(exc))}"
    escape = form.range_end(re_parser.parse(form.text)) if form.written else None
    if escape is not None:
        return f"has the property escape {escape!r} as the end of a range, which it cannot be"
    return None


_CLASS_OPERATORS = ("&&", "--", "~~", "||")


def _ambiguous_class(pattern: str) -> str | None:
    """A ``[`` or a doubled ``&``, ``-``, ``~`` or ``|`` inside a character class: Rust's
    ``regex`` (llguidance) reads a nested class or a set operation there, Python's ``re`` and
    ECMA patterns the characters themselves (``[a-z&&[^aeiou]]``: consonants to one, any of
    ``a-z&[^aeiou`` then ``]`` to the other)."""
    i, in_class = 0, False
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            i += 2
            continue
        if not in_class:
            if ch == "[":
                in_class = True
                i += 1 + pattern.startswith("^", i + 1)
                i += pattern.startswith("]", i)  # a "]" first is the character
                continue
        elif ch == "]":
            in_class = False
        elif ch == "[":
            return (
                f"a '[' inside a character class at {i} (a nested class to some regex"
                " engines, the character to others): write \\[ for the character"
            )
        elif pattern.startswith(_CLASS_OPERATORS, i):
            return (
                f"{pattern[i : i + 2]!r} inside a character class at {i} (a set operation to some"
                f" regex engines, two characters to others): escape them, as \\{ch}\\{ch}"
            )
        i += 1
    return None


def _regex_nodes(pattern: str) -> Iterator[tuple[Any, Any, int]]:
    """Every node of Python's parse of ``pattern``, nested ones too, as (opcode, argument,
    copies): how many times the counted repetitions around the node repeat it. Nothing when
    Python cannot parse the pattern."""
    parsed = _parsed(pattern)
    if parsed is None:
        return
    pending: list[tuple[Any, int]] = [(parsed, 1)]
    while pending:
        node, copies = pending.pop()
        if isinstance(node, re_parser.SubPattern):
            for op, argument in node:
                yield op, argument, copies
                if op in REPEATS:
                    pending.append((argument[2], copies * _bound(argument)))
                elif op is not re_constants.IN:  # a class's items hold no subpattern
                    pending.append((argument, copies))
        elif isinstance(node, list | tuple):
            pending.extend((child, copies) for child in node)


def _parsed(pattern: str) -> Any:
    """Python's parse of ``pattern``, property escapes expanded (runtime.unicode_properties);
    None when Python cannot parse it."""
    form = python_form(pattern)
    try:
        return form.expand(re_parser.parse(form.text))
    except (re.error, OverflowError):  # check_regex refuses the latter first
        return None


def _bound(repeat: tuple[int, int, Any]) -> int:
    """The copies one repetition (min, max, body) asks for: its upper bound, or its lower
    one when unbounded (``{5,}`` unrolls 5, then loops); at least 1."""
    low, high, _ = repeat
    return max(low if high == re_constants.MAXREPEAT else high, 1)
