"""Incremental decoding of the tool envelope, so a streamed response can look like OpenAI's.

The constrained model streams JSON such as ``{"tool": "get_weather", "arguments": {...}}``
or ``{"answer": "Hello"}``; an OpenAI client expects tool-call deltas (index, id, name,
arguments text) or content deltas. :class:`EnvelopeStreamDecoder` scans the JSON as it
arrives and emits those events; :meth:`EnvelopeStreamDecoder.finish` returns the same
``ParsedResponse`` as ``plan.parse(full_text)`` (it *is* that call, with the same call ids),
so what was streamed and what is receipted cannot disagree.
"""

from __future__ import annotations

import codecs
import json
from dataclasses import dataclass, field
from typing import Literal

from runtime.call_ids import CallIds
from runtime.errors import OutputLeftGrammar, StructuredOutputInvalid
from runtime.output_parsing import ParsedResponse
from runtime.planning import Plan
from runtime.thinking import THINK_CLOSE, THINK_OPEN, split_thinking

_WS = " \t\n\r"


@dataclass(frozen=True)
class ContentDelta:
    """Pass-through text (text, regex, ebnf and json modes)."""

    text: str


@dataclass(frozen=True)
class AnswerDelta:
    """Text of the envelope's answer (unescaped string, or JSON text of a structured answer)."""

    text: str


@dataclass(frozen=True)
class ToolCallStart:
    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ToolArgumentsDelta:
    """A piece of the call's arguments JSON, as the model wrote it."""

    index: int
    text: str


EnvelopeEvent = ContentDelta | AnswerDelta | ToolCallStart | ToolArgumentsDelta


@dataclass
class _Frame:
    kind: Literal["obj", "arr"]
    key: str | int | None = None  # key (object) or index (array) of the value being read
    expect: Literal["first", "key", "colon", "value", "next"] = "first"


@dataclass
class _Capture:
    """A value of interest being read: the answer, a call's name, or a call's arguments."""

    role: Literal["answer", "name", "args"]
    index: int
    depth: int  # stack depth at which the value sits; it ends when the stack returns here
    raw: bool  # raw JSON text (arguments, structured answer) vs unescaped string content
    pending: str = ""  # unescaped mode: raw string content not yet decodable
    text: list[str] = field(default_factory=list)  # name mode: decoded so far


def parse_output(
    plan: Plan, text: str, *, cut: bool, enforced_by: str | None = None
) -> ParsedResponse:
    """The meaning of a whole output, as ``plan.parse`` gives it. One that the token limit or
    a stop string cut off (``cut``) before its constraint was done is what a stream of it
    would have shown (EnvelopeStreamDecoder.finish), as OpenAI returns it; ``plan.parse``'s
    error is raised only when that is nothing either (a tool call never leaves incomplete)."""
    try:
        return plan.parse(text, cut=cut, enforced_by=enforced_by)
    except StructuredOutputInvalid as exc:
        if not cut or isinstance(exc, OutputLeftGrammar):
            raise
        error = exc
    decoder = EnvelopeStreamDecoder(plan)
    decoder.feed(text)
    try:
        return decoder.finish(cut=True)[1]
    except StructuredOutputInvalid:
        raise error from None


class EnvelopeStreamDecoder:
    """Feed text (or UTF-8 bytes) deltas; get OpenAI-shaped events; finish with the parse."""

    def __init__(self, plan: Plan, ids: CallIds | None = None):
        self._plan = plan
        self._ids = ids or CallIds()
        self._utf8 = codecs.getincrementaldecoder("utf-8")()
        self._text: list[str] = []
        self._envelope = plan.mode == "tools"
        self._opaque = False  # tools mode but not a bare envelope: events come at finish
        self._stack: list[_Frame] = []
        self._top_done = False
        self._in_string = False
        self._key: list[str] | None = None  # set while reading an object key
        self._escape = False
        self._scalar = False
        self._cap: _Capture | None = None
        self._names: dict[int, str] = {}
        self._held_args: dict[int, list[str]] = {}
        self._out: list[EnvelopeEvent] = []
        self._answer: list[str] | None = None  # the answer's text so far, once it has begun
        self._calls_begun = False
        self._think = _LeadingThink()  # pass-through modes: content starts after it

    def feed(self, delta: str | bytes) -> list[EnvelopeEvent]:
        text = self._utf8.decode(delta) if isinstance(delta, bytes) else delta
        if not text:
            return []
        self._text.append(text)
        if not self._envelope:
            content = self._think.feed(text)
            return [ContentDelta(content)] if content else []
        for ch in text:
            if self._opaque:
                break
            self._step(ch)
        return self._drain()

    def finish(
        self, *, cut: bool = False, enforced_by: str | None = None
    ) -> tuple[list[EnvelopeEvent], ParsedResponse]:
        """The remaining events and the authoritative parse (raises as ``plan.parse`` does,
        ``enforced_by`` as it takes it).

        ``cut``: the token limit or a stop string ended the output. OpenAI returns such an
        output as far as it got, and so does this for text: the answer streamed so far, or
        the raw content. A tool call never leaves incomplete: that still raises.
        """
        tail = self._utf8.decode(b"", final=True)
        events = self.feed(tail) if tail else []
        if not self._envelope and (held := self._think.flush()):
            events.append(ContentDelta(held))
        text = "".join(self._text)
        try:
            result = self._plan.parse(text, self._ids, cut=cut, enforced_by=enforced_by)
        except StructuredOutputInvalid as exc:
            partial = (
                self._cut_text(text) if cut and not isinstance(exc, OutputLeftGrammar) else None
            )
            if partial is None:
                raise
            return events, partial
        if self._opaque:
            events += _events_of(result)
        return events, result

    def _cut_text(self, text: str) -> ParsedResponse | None:
        """What a cut-off output says so far, unless it began a tool call, even by its first
        key alone (or is opaque). Cut inside the envelope before anything began (`{"`,
        `{"answer":`), it says nothing yet: an empty answer where the tool choice allows one,
        as OpenAI returns a text cut off at once; where calls are required, there is no
        answer to give."""
        if not self._envelope:
            reasoning, body = split_thinking(text)
            return ParsedResponse("text", content=body, reasoning=reasoning, complete=False)
        if self._opaque or self._calls_begun or self._chose_calls():
            return None
        choice = self._plan.tool_choice
        if self._answer is None and (choice is None or not choice.allows_answer):
            return None
        answer = "".join(self._answer or ())
        if self._plan.answer_schema is None:
            return ParsedResponse("answer", answer=answer, content=answer, complete=False)
        return ParsedResponse("text", content=answer, complete=False)  # structured, unfinished

    def _chose_calls(self) -> bool:
        """Whether the envelope's first key is, or can only become, "tool" or "tool_calls"
        (an answer's is "answer"): the model chose to call before it named a tool."""
        if not self._stack:
            return False
        top = self._stack[0]
        if isinstance(top.key, str):
            key = top.key
        elif self._key is not None and len(self._stack) == 1:
            key = "".join(self._key)
        else:
            key = ""
        return key.startswith("t")

    # ----------------------------------------------------------------- scanning

    def _step(self, ch: str) -> None:
        if self._scalar and not self._in_string and (ch in _WS or ch in ",}]"):
            self._scalar = False
            self._end_capture_at(len(self._stack))
        if not self._in_string and ch not in _WS and self._expects_value():
            if not self._stack and ch != "{":
                self._opaque = True  # e.g. a <think> region or tagged calls: parse at finish
                return
            self._start_value(ch)
        cap = self._cap
        self._consume(ch)
        if cap is not None and cap.raw:
            self._emit_raw(cap, ch)

    def _expects_value(self) -> bool:
        if not self._stack:
            return not self._top_done
        frame = self._stack[-1]
        return frame.expect == "value" or (frame.kind == "arr" and frame.expect == "first")

    def _start_value(self, ch: str) -> None:
        if self._stack and self._stack[-1].kind == "arr" and ch == "]":
            return  # empty array: no value starts
        path = [f.key for f in self._stack]
        role = _role_of(path)
        if role is not None:
            kind, index = role
            raw = kind == "args" or (
                kind == "answer" and (ch != '"' or self._plan.answer_schema is not None)
            )
            self._cap = _Capture(kind, index, len(self._stack), raw)
            if kind == "answer":
                self._answer = []
            else:
                self._calls_begun = True
        if self._stack:
            self._stack[-1].expect = "next"
        else:
            self._top_done = True

    def _consume(self, ch: str) -> None:
        if self._in_string:
            self._string_char(ch)
            return
        if ch in _WS:
            return
        frame = self._stack[-1] if self._stack else None
        if ch == '"':
            self._in_string = True
            if frame is not None and frame.kind == "obj" and frame.expect in ("first", "key"):
                self._key = []
        elif ch in "{[":
            self._stack.append(_Frame("obj" if ch == "{" else "arr", None if ch == "{" else 0))
        elif ch in "}]":
            if self._stack:
                self._stack.pop()
                self._end_capture_at(len(self._stack), closing=ch)
        elif frame is None:
            self._scalar = True
        elif ch == ":" and frame.expect == "colon":
            frame.expect = "value"
        elif ch == "," and frame.expect == "next":
            if frame.kind == "arr":
                frame.key = int(frame.key or 0) + 1
                frame.expect = "value"
            else:
                frame.expect = "key"
        else:
            self._scalar = True

    def _string_char(self, ch: str) -> None:
        if self._escape:
            self._escape = False
        elif ch == "\\":
            self._escape = True
        elif ch == '"':
            self._in_string = False
            if self._key is not None:
                frame = self._stack[-1]
                frame.key = _unescape("".join(self._key))
                frame.expect = "colon"
                self._key = None
            else:
                self._end_capture_at(len(self._stack), closing=ch)
            return
        if self._key is not None:
            self._key.append(ch)
        elif self._cap is not None and not self._cap.raw and self._cap.depth == len(self._stack):
            self._cap.pending += ch
            self._decode_pending(self._cap, final=False)

    # ----------------------------------------------------------------- captures

    def _end_capture_at(self, depth: int, closing: str | None = None) -> None:
        cap = self._cap
        if cap is None or cap.depth != depth:
            return
        if cap.raw and closing is not None:
            self._emit_raw(cap, closing)
        elif not cap.raw:
            self._decode_pending(cap, final=True)
        self._cap = None
        if cap.role == "name":
            self._start_call(cap.index, "".join(cap.text))

    def _emit_raw(self, cap: _Capture, ch: str) -> None:
        if cap is not self._cap:
            return  # the closing char was already emitted by _end_capture_at
        if cap.role == "answer":
            self._add_answer(ch)
        elif cap.index in self._names:
            self._out.append(ToolArgumentsDelta(cap.index, ch))
        else:
            self._held_args.setdefault(cap.index, []).append(ch)

    def _decode_pending(self, cap: _Capture, *, final: bool) -> None:
        cut = len(cap.pending) if final else _decodable_prefix(cap.pending)
        if cut == 0:
            return
        try:
            piece = json.loads('"' + cap.pending[:cut] + '"')
        except ValueError:
            return  # invalid JSON string: finish() reports it through plan.parse
        cap.pending = cap.pending[cut:]
        if cap.role == "answer":
            self._add_answer(piece)
        else:
            cap.text.append(piece)

    def _add_answer(self, text: str) -> None:
        assert self._answer is not None
        self._answer.append(text)
        self._out.append(AnswerDelta(text))

    def _start_call(self, index: int, name: str) -> None:
        self._names[index] = name
        self._out.append(ToolCallStart(index, self._ids.for_index(index), name))
        held = self._held_args.pop(index, None)
        if held:
            self._out.append(ToolArgumentsDelta(index, "".join(held)))

    def _drain(self) -> list[EnvelopeEvent]:
        """This feed's events, with runs of same-kind deltas merged into one."""
        merged: list[EnvelopeEvent] = []
        for event in self._out:
            last = merged[-1] if merged else None
            if isinstance(event, AnswerDelta) and isinstance(last, AnswerDelta):
                merged[-1] = AnswerDelta(last.text + event.text)
            elif (
                isinstance(event, ToolArgumentsDelta)
                and isinstance(last, ToolArgumentsDelta)
                and last.index == event.index
            ):
                merged[-1] = ToolArgumentsDelta(event.index, last.text + event.text)
            else:
                merged.append(event)
        self._out = []
        return merged


class _LeadingThink:
    """Holds back an output's leading ``<think>`` region, which ``Plan.parse`` keeps out of
    the content (``split_thinking``), so a stream shows what the receipt records."""

    def __init__(self) -> None:
        self._held = ""
        self._state: Literal["undecided", "inside", "done"] = "undecided"

    def feed(self, text: str) -> str:
        """The part of ``text`` that is content (may be empty while undecided)."""
        if self._state == "done":
            return text
        self._held += text
        if self._state == "undecided":
            head = self._held.lstrip()
            if head.startswith(THINK_OPEN):
                self._state = "inside"
            elif THINK_OPEN.startswith(head):
                return ""  # whitespace, or a prefix of the tag: could still open one
            else:
                self._state, content, self._held = "done", self._held, ""
                return content
        end = self._held.find(THINK_CLOSE)
        if end < 0:
            return ""
        self._state, content = "done", self._held[end + len(THINK_CLOSE) :]
        self._held = ""
        return content

    def flush(self) -> str:
        """At the end: text that only looked like the start of a tag; an unclosed region is
        all reasoning."""
        held, self._held = self._held, ""
        return held if self._state == "undecided" else ""


def _role_of(path: list[str | int | None]) -> tuple[Literal["answer", "name", "args"], int] | None:
    """Which envelope value sits at ``path``, and for which call index."""
    if path == ["answer"]:
        return "answer", 0
    if path == ["tool"]:
        return "name", 0
    if path == ["arguments"]:
        return "args", 0
    if len(path) == 3 and path[0] == "tool_calls" and isinstance(path[1], int):
        if path[2] == "tool":
            return "name", path[1]
        if path[2] == "arguments":
            return "args", path[1]
    return None


def _decodable_prefix(raw: str) -> int:
    """Length of the longest prefix of JSON string content that holds no unfinished escape.

    A ``\\uD8xx`` high surrogate waits for the low half that may follow, so a pair is never
    decoded as two lone surrogates.
    """
    i = 0
    while i < len(raw):
        if raw[i] != "\\":
            i += 1
            continue
        if i + 1 >= len(raw):
            return i
        if raw[i + 1] != "u":
            i += 2
            continue
        if i + 6 > len(raw):
            return i
        try:
            high = 0xD800 <= int(raw[i + 2 : i + 6], 16) <= 0xDBFF
        except ValueError:
            return i
        rest = raw[i + 6 : i + 12]
        if high and len(rest) < 6 and "\\u".startswith(rest[:2]):
            return i  # the low half of the pair may still be on its way
        i += 12 if high and rest.startswith("\\u") else 6
    return i


def _unescape(raw: str) -> str:
    try:
        return json.loads('"' + raw + '"')
    except ValueError:
        return raw  # invalid escapes: finish() reports it through plan.parse


def _events_of(result: ParsedResponse) -> list[EnvelopeEvent]:
    """All events for an output that could only be understood once complete."""
    if result.kind == "tool_calls":
        events: list[EnvelopeEvent] = []
        for i, call in enumerate(result.tool_calls):
            events += [
                ToolCallStart(i, call.id, call.name),
                ToolArgumentsDelta(i, call.arguments_json()),
            ]
        return events
    return [AnswerDelta(result.content)] if result.content else []


__all__ = [
    "AnswerDelta",
    "ContentDelta",
    "EnvelopeEvent",
    "EnvelopeStreamDecoder",
    "ToolArgumentsDelta",
    "ToolCallStart",
]
