"""Reading a Lark grammar without parsing it: one lexing pass that sets its literals, comments
and embedded ``%json`` schemas aside, then the two measures the limits need, the copies its
counted repetitions ask for and how deep its rule references nest.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from runtime.regex_features import repeated_copies

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
class LexedGrammar:
    bare: str  # the grammar with comments dropped and each literal or schema emptied
    regexes: tuple[str, ...]  # the patterns of its regex literals
    schemas: tuple[bytes, ...]  # the JSON texts of its %json schemas
    specials: tuple[str, ...] = ()  # its special tokens (<|im_end|>, <[2]>), as written
    schema_spans: tuple[tuple[int, int], ...] = ()  # where each %json schema's text stands


def lex_grammar(lark: str) -> LexedGrammar:
    parts: list[str] = []
    regexes: list[str] = []
    schemas: list[bytes] = []
    specials: list[str] = []
    spans: list[tuple[int, int]] = []
    at = 0
    while (start := _LARK_START.search(lark, at)) is not None:
        parts.append(lark[at : start.start()])
        token, at = start.group(), start.start()
        if token in ("//", "#"):
            at = _LARK_COMMENT.match(lark, at).end()  # type: ignore[union-attr]
        elif token == "<":
            special = _LARK_SPECIAL.match(lark, at)
            parts.append("<>" if special else "<")
            if special:
                specials.append(special.group())
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
            spans.append((start.end(), end))
            parts.append("%json {}")
            at = end
    else:
        parts.append(lark[at:])
    return LexedGrammar(
        "".join(parts), tuple(regexes), tuple(schemas), tuple(specials), tuple(spans)
    )


def with_json_options(lark: str, options: dict[str, Any]) -> str:
    """``lark`` with ``options`` set in the ``x-guidance`` of each ``%json`` schema, over any
    the schema sets: llguidance applies the options it is given at compile time to a JSON
    schema constraint alone, and an embedded schema's from its own ``x-guidance`` (without
    them a grammar's JSON took any whitespace, and a weak model wrote newlines until
    max_tokens). A schema that is not a JSON object, or holds a number past a double, is
    left as written (validation refuses the first; llguidance reads the second)."""
    parts: list[str] = []
    at = 0
    for start, end in lex_grammar(lark).schema_spans:
        try:
            schema = json.loads(lark[start:end])
            if not isinstance(schema, dict):
                continue
            guidance = schema.get("x-guidance")
            schema["x-guidance"] = {**(guidance if isinstance(guidance, dict) else {}), **options}
            text = json.dumps(schema, ensure_ascii=False, allow_nan=False)
        except ValueError:
            continue
        parts += [lark[at:start], text]
        at = end
    return "".join(parts) + lark[at:]


# item ~ n, item ~ m..n, item{n}, item{m,n}: the upper bound (or the lower, when open)
_GRAMMAR_REPEAT = re.compile(r"~\s*(\d+)(?:\s*\.\.\s*(\d+))?|\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")
_HUGE = 10**9  # a bound written with more digits counts as this (int() of 5,000 digits fails)
_GRAMMAR_PAREN = re.compile(r"[()]")
_SPACES = re.compile(r"\s*")


def grammar_repeat_copies(lexed: LexedGrammar) -> int:
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


def grammar_depth(lexed: LexedGrammar) -> int:
    """How deep a Lark grammar nests: the longest chain of rule references from ``start``
    (from every rule when there is none), each reference weighted 1 plus the groups
    (``(...)``, ``[...]``) around it in its rule. A recursive rule counts once. Read without
    strings, regexes, comments and embedded schemas (:func:`lex_grammar`); iterative, as deep
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


__all__ = ["LexedGrammar", "grammar_depth", "grammar_repeat_copies", "lex_grammar"]
