"""What a regex holds, read from Python's own parse of it: the features no automaton can
enforce (lookaround, backreferences, word boundaries), the reasons it cannot be a constraint
at all, character classes that regex engines read differently, and how many copies its counted
repetitions ask for. Kept apart from runtime.redos, which answers one question (can a
backtracking engine split the input many ways) on one node of the same parse.
"""

from __future__ import annotations

import re
import re._constants as re_constants
import re._parser as re_parser
from collections.abc import Iterator
from typing import Any

from runtime.constraint import Constraint
from runtime.redos import REPEATS
from runtime.schema_walk import schema_patterns
from runtime.unicode_properties import property_error, python_form


def repeated_copies(pattern: str) -> int:
    """How many copies of pieces the counted repetitions ask for, in total: each repetition's
    bound times the bounds around it (``(a{10}b){20}`` is 20 + 200), summed over the pattern
    (``a{999}`` written 150 times is 149,850, though no one bound is over the limit). Read
    from Python's own parse, so every spelling counts (``{n}``, ``{m,n}``, ``{,n}``,
    ``{n,}``); an unbounded ``*`` or ``+`` is a loop, not copies. 0 when Python cannot parse
    it (validation says why)."""
    return sum(
        copies * _bound(argument) for op, argument, copies in regex_nodes(pattern) if op in REPEATS
    )


def regex_loops(pattern: str) -> int:
    """The most unbounded repetitions (``*``, ``+``, ``{n,}``) ``pattern`` puts side by side,
    nothing between them: ``.*.*`` is 2, ``(?:.*){64}`` is 64, ``(?:.*,){200}`` is 1 (a comma
    parts them). Side by side, each can take what the next would, and xgrammar's compile
    time grows with the square of their number. 0 when Python cannot parse it."""
    parsed = _parsed(pattern)
    return 0 if parsed is None else _loop_runs(parsed)[1]


def _loop_runs(items: Any) -> tuple[int | None, int]:
    """(chain, longest) of a parsed sequence: ``chain`` the loops side by side it is made of
    when it holds nothing else (None when it does), ``longest`` the most side by side
    anywhere in it."""
    chain: int | None = 0
    run = longest = 0
    for op, argument in items:
        piece, inner = _loop_piece(op, argument)
        longest = max(longest, inner)
        if piece is None:
            chain, run = None, 0
        else:
            run += piece
            chain = None if chain is None else chain + piece
            longest = max(longest, run)
    return chain, longest


def _loop_piece(op: Any, argument: Any) -> tuple[int | None, int]:
    """(chain, longest) of one parsed node, as _loop_runs gives them for a sequence."""
    if op in REPEATS:
        _, high, body = argument
        chain, longest = _loop_runs(body)
        if high == re_constants.MAXREPEAT:
            return 1 + (chain or 0), max(longest, 1 + (chain or 0))
        copies = None if chain is None else chain * high
        return copies, max(longest, copies or 0)
    if op is re_constants.SUBPATTERN:
        return _loop_runs(argument[-1])
    if op is re_constants.BRANCH:
        runs = [_loop_runs(branch) for branch in argument[1]]
        chains = [chain for chain, _ in runs]
        chain = None if None in chains else max(chains, default=0)
        return chain, max((longest for _, longest in runs), default=0)
    if op is re_constants.AT:  # an anchor holds no character: it parts nothing
        return 0, 0
    return None, 0


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
    """The first thing in ``pattern`` that no grammar backend enforces, or None: what needs
    to look at text around the current position (an automaton cannot), and what
    :func:`misread_construct` finds. Checked before any engine sees the regex, so the vLLM
    path refuses what the embedded one does."""
    for op, argument, _ in regex_nodes(pattern):
        if op in _LOOKAROUNDS:
            return "a lookahead or lookbehind"
        if op in _BACKREFERENCES:
            return "a backreference"
        if op is re_constants.AT and argument in _WORD_BOUNDARIES:
            return "a word boundary (\\b or \\B)"
    return misread_construct(pattern)


def misread_construct(pattern: str) -> str | None:
    """A construct of ``pattern`` that Python's ``re`` (the regex check) and jsonschema-rs
    (the schema check) read and the grammar backends do not: a possessive quantifier, which
    llguidance enforces as a greedy one (``[ab]++b`` matches nothing to the check, and the
    decoder wrote to max_tokens), or an atomic group, which none of them parses. None when
    there is neither."""
    for op, _, _ in regex_nodes(pattern):
        if op is re_constants.POSSESSIVE_REPEAT:
            return "a possessive quantifier (x++, x*+, x?+ or x{m,n}+)"
        if op is re_constants.ATOMIC_GROUP:
            return "an atomic group (?>...)"
    return None


def regex_problem(pattern: str) -> str | None:
    """Why ``pattern`` cannot be a constraint's regex, or None: Python's ``re`` (what reads
    and limits every regex here) does not compile it, Unicode property escapes aside (their
    names are checked against the regex module and llguidance: runtime.unicode_properties),
    or it writes a character class that the decoders' engines read one way and the output
    checks another."""
    ambiguous = ambiguous_class(pattern)  # first: Python warns on some of these
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
    bound = _open_lower_bound(pattern)
    if bound is not None:  # llguidance and xgrammar refuse it, naming their parsers' insides
        return (
            f"writes the repetition {bound}, which Python reads as {{0,{bound[2:-1]}}} and the"
            f" decoders' regex engines do not read: write {{0,{bound[2:-1]}}}"
        )
    return None


_OPEN_LOWER_BOUND = re.compile(r"\{,[0-9]+\}")


def _open_lower_bound(pattern: str) -> str | None:
    """The first ``{,n}`` repetition outside a character class, or None."""
    for i, ch, in_class in _unescaped(pattern):
        if ch == "{" and not in_class and (found := _OPEN_LOWER_BOUND.match(pattern, i)):
            return found.group()
    return None


_CLASS_OPERATORS = ("&&", "--", "~~", "||")


def ambiguous_class(pattern: str) -> str | None:
    """A ``[`` or a doubled ``&``, ``-``, ``~`` or ``|`` inside a character class: Rust's
    ``regex`` (llguidance) reads a nested class or a set operation there, Python's ``re`` and
    ECMA patterns the characters themselves (``[a-z&&[^aeiou]]``: consonants to one, any of
    ``a-z&[^aeiou`` then ``]`` to the other)."""
    for i, ch, in_class in _unescaped(pattern):
        if not in_class or ch == "]":
            continue
        if ch == "[":
            return (
                f"a '[' inside a character class at {i} (a nested class to some regex"
                " engines, the character to others): write \\[ for the character"
            )
        if pattern.startswith(_CLASS_OPERATORS, i):
            return (
                f"{pattern[i : i + 2]!r} inside a character class at {i} (a set operation to some"
                f" regex engines, two characters to others): escape them, as \\{ch}\\{ch}"
            )
    return None


def group_depth(pattern: str) -> int:
    """How deeply ``pattern``'s groups nest: parentheses outside character classes, escapes
    skipped (a malformed pattern gets a number all the same; its parse says what is wrong)."""
    depth = deepest = 0
    for _, ch, in_class in _unescaped(pattern):
        if in_class:
            continue
        if ch == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif ch == ")":
            depth -= 1
    return deepest


def group_construct(pattern: str) -> str | None:
    """The first ``(?`` group that is not a plain ``(?:``: inline flags (``(?i)``,
    ``(?s:``), a named group (``(?P<n>``), a comment (``(?#``) or a lookaround, as written
    up to its fourth character; None if there is none."""
    for i, ch, in_class in _unescaped(pattern):
        opens = ch == "(" and not in_class and pattern.startswith("?", i + 1)
        if opens and not pattern.startswith(":", i + 2):
            return pattern[i : i + 4]
    return None


def _unescaped(pattern: str) -> Iterator[tuple[int, str, bool]]:
    """(position, character, inside a character class) of each character no backslash
    escapes. A class's opening ``[`` comes as outside it, its closing ``]`` as inside; the
    ``^`` and a first ``]`` just after the opening (characters of the class) are skipped."""
    i, in_class = 0, False
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            i += 2
            continue
        yield i, ch, in_class
        if in_class:
            in_class = ch != "]"
        elif ch == "[":
            in_class = True
            i += 1 + pattern.startswith("^", i + 1)
            i += pattern.startswith("]", i)  # a "]" first is the character
            continue
        i += 1


def regex_nodes(pattern: str) -> Iterator[tuple[Any, Any, int]]:
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


__all__ = [
    "ambiguous_class",
    "constraint_patterns",
    "group_construct",
    "misread_construct",
    "regex_loops",
    "regex_nodes",
    "regex_problem",
    "repeated_copies",
    "unenforceable_regex_feature",
]
