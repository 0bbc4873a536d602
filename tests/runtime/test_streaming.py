"""runtime.streaming: the envelope decoder streams OpenAI-shaped events and ends with exactly
``plan.parse(full_text)``, wherever the text is cut into deltas (every byte boundary)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tool_samples import ANSWER_SCHEMA, TOOLS

from runtime.call_ids import CallIds
from runtime.errors import StructuredOutputInvalid
from runtime.output_parsing import ParsedResponse
from runtime.planning import ChatInput, Plan, plan_chat
from runtime.streaming import (
    AnswerDelta,
    ContentDelta,
    EnvelopeEvent,
    EnvelopeStreamDecoder,
    ToolArgumentsDelta,
    ToolCallStart,
)

USER = [{"role": "user", "content": "hi"}]
TOOLS_PLAN = plan_chat(ChatInput(USER, tools=TOOLS))
RF = {"type": "json_schema", "json_schema": {"name": "r", "schema": ANSWER_SCHEMA}}
STRUCTURED_PLAN = plan_chat(ChatInput(USER, tools=TOOLS, response_format=RF))

ENVELOPES = [
    '{"tool":"get_weather","arguments":{"city":"Paris"}}',
    '{ "tool" : "get_weather" ,\n  "arguments" : { "city" : "Pa \\"ris\\" \\\\ {x}" , "unit":"celsius" } }',
    '{"arguments":{"guest":{"name":"Ada","age":36},"nights":2},"tool":"book_room"}',
    '{"tool":"list_rooms","arguments":{}}',
    (
        '{"tool_calls":[{"tool":"get_weather","arguments":{"city":"Zürich"}},'
        ' {"tool":"book_room","arguments":{"guest":{"name":"Bo"},"nights":1}},'
        '{"tool":"list_rooms","arguments":{}}]}'
    ),
    '{"answer":"Sunny, 18\\u00b0C \\ud83d\\ude00 \\"quoted\\" \\n next\\tline \\/ é 日本"}',
    '{"answer":""}',
    '  {"answer": "tab\\there"}  ',
]
STRUCTURED = [
    '{"answer":{"summary":"fine \\u00e9","score":0.75}}',
    '{"answer": { "summary" : "a b" , "score" : 1e3 } }',
    '{"tool":"list_rooms","arguments":{}}',
]


def replay(plan: Plan, chunks: Sequence[str | bytes]) -> tuple[list[EnvelopeEvent], ParsedResponse]:
    """Stream ``chunks`` and check the end result is plan.parse of the whole text."""
    ids = CallIds()
    decoder = EnvelopeStreamDecoder(plan, ids)
    events: list[EnvelopeEvent] = []
    for chunk in chunks:
        events += decoder.feed(chunk)
    tail, result = decoder.finish()
    text = b"".join(c if isinstance(c, bytes) else c.encode() for c in chunks).decode()
    assert result == plan.parse(text, ids)
    return events + tail, result


def assert_consistent(events: list[EnvelopeEvent], result: ParsedResponse) -> None:
    """The streamed events say what the final parse says, in the same bytes."""
    starts = [e for e in events if isinstance(e, ToolCallStart)]
    assert [(s.index, s.id, s.name) for s in starts] == [
        (i, c.id, c.name) for i, c in enumerate(result.tool_calls)
    ]
    for i, call in enumerate(result.tool_calls):
        pieces = [e.text for e in events if isinstance(e, ToolArgumentsDelta) and e.index == i]
        assert "".join(pieces) == call.arguments_json()  # the bytes a response carries
        assert json.loads("".join(pieces)) == call.arguments
    # every arguments delta follows its call's start, as OpenAI clients require
    started: set[int] = set()
    for e in events:
        if isinstance(e, ToolCallStart):
            started.add(e.index)
        elif isinstance(e, ToolArgumentsDelta):
            assert e.index in started
    answer = "".join(e.text for e in events if isinstance(e, AnswerDelta))
    if result.kind == "answer":
        assert answer == result.answer
    elif result.kind == "parsed":
        assert answer == result.content and json.loads(answer) == result.parsed
    else:
        assert answer == ""


def splits(text: str) -> list[list[bytes]]:
    """The text's UTF-8 bytes cut in two at every byte boundary, plus one byte at a time."""
    raw = text.encode()
    return [[raw[:i], raw[i:]] for i in range(len(raw) + 1)] + [
        [raw[i : i + 1] for i in range(len(raw))]
    ]


@pytest.mark.parametrize(
    ("plan", "text"),
    [(TOOLS_PLAN, t) for t in ENVELOPES] + [(STRUCTURED_PLAN, t) for t in STRUCTURED],
)
def test_every_byte_boundary_gives_the_same_result(plan: Plan, text: str) -> None:
    for chunks in splits(text):
        events, result = replay(plan, chunks)
        assert_consistent(events, result)


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(ENVELOPES), st.lists(st.integers(0, 400), max_size=12))
def test_random_chunking(text: str, cuts: list[int]) -> None:
    points = sorted({min(c, len(text)) for c in cuts})
    chunks = [text[a:b] for a, b in zip([0, *points], [*points, len(text)])]
    events, result = replay(TOOLS_PLAN, chunks)
    assert_consistent(events, result)


def test_a_call_is_announced_as_soon_as_its_name_is_complete() -> None:
    decoder = EnvelopeStreamDecoder(TOOLS_PLAN)
    assert decoder.feed('{"tool": "get_wea') == []
    (start,) = decoder.feed('ther", "argu')
    assert isinstance(start, ToolCallStart) and start.name == "get_weather"
    assert decoder.feed('ments": {"city": "Pa') == [ToolArgumentsDelta(0, '{"city": "Pa')]
    assert decoder.feed('ris"}}') == [ToolArgumentsDelta(0, 'ris"}')]
    _, result = decoder.finish()
    assert result.tool_calls[0].id == start.id


def test_answer_streams_unescaped_text() -> None:
    decoder = EnvelopeStreamDecoder(TOOLS_PLAN)
    assert decoder.feed('{"answer": "Hel') == [AnswerDelta("Hel")]
    assert decoder.feed("lo\\") == [AnswerDelta("lo")]  # the escape waits for its second char
    assert decoder.feed("n\\ud83d") == [AnswerDelta("\n")]  # a high surrogate waits for its pair
    assert decoder.feed('\\ude00"}') == [AnswerDelta("😀")]


@pytest.mark.parametrize(
    ("fields", "text"),
    [
        ({}, "Hello there, 日本 😀"),
        ({"regex": r"\d+"}, "12345"),
        ({"response_format": RF}, '{"summary": "x", "score": 1}'),
    ],
)
def test_other_modes_pass_content_through(fields: dict[str, Any], text: str) -> None:
    plan = plan_chat(ChatInput(USER, **fields))
    for chunks in splits(text):
        events, _ = replay(plan, chunks)
        assert all(isinstance(e, ContentDelta) for e in events)
        assert "".join(e.text for e in events if isinstance(e, ContentDelta)) == text


def test_thinking_output_is_decoded_at_finish() -> None:
    text = '<think>weather?</think>{"tool":"get_weather","arguments":{"city":"Oslo"}}'
    decoder = EnvelopeStreamDecoder(TOOLS_PLAN)
    assert decoder.feed(text[:20]) == [] and decoder.feed(text[20:]) == []
    events, result = decoder.finish()
    assert result.reasoning == "weather?"
    assert events == [
        ToolCallStart(0, result.tool_calls[0].id, "get_weather"),
        ToolArgumentsDelta(0, '{"city":"Oslo"}'),
    ]


def test_invalid_output_fails_at_finish() -> None:
    decoder = EnvelopeStreamDecoder(TOOLS_PLAN)
    decoder.feed('{"tool": "get_weather", "arguments": {"city": 5}}')
    with pytest.raises(StructuredOutputInvalid) as err:
        decoder.finish()
    assert err.value.pointer == "/arguments/city"


def test_truncated_output_fails_at_finish() -> None:
    decoder = EnvelopeStreamDecoder(TOOLS_PLAN)
    decoder.feed('{"answer": "cut sho')
    with pytest.raises(StructuredOutputInvalid):
        decoder.finish()


def _cut(plan: Plan, text: str) -> tuple[str, ParsedResponse]:
    """Stream ``text`` one character at a time as if the token limit ended it: (streamed
    text, parse)."""
    decoder = EnvelopeStreamDecoder(plan)
    events: list[EnvelopeEvent] = []
    for i in range(len(text)):
        events += decoder.feed(text[i])
    tail, result = decoder.finish(cut=True)
    streamed = "".join(e.text for e in events + tail if isinstance(e, AnswerDelta | ContentDelta))
    return streamed, result


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ('{"answer": "cut sho', "cut sho"),
        ('{"answer": "caf\\u00e', "caf"),  # half an escape is not text yet
        ('{"answer": "smile \\ud83d', "smile "),  # nor half a surrogate pair
        ('{"answer": "line\\nbreak \\"q', 'line\nbreak "q'),
        ('{"answer": "', ""),
    ],
)
def test_a_cut_off_answer_is_returned_as_far_as_it_streamed(text: str, answer: str) -> None:
    """What OpenAI does with a reply the token limit cut: the text so far, not an error;
    exactly the text already streamed, and marked as not satisfying its constraint."""
    streamed, result = _cut(TOOLS_PLAN, text)
    assert (result.kind, result.content, result.answer, streamed) == (
        "answer",
        answer,
        answer,
        answer,
    )
    assert result.complete is False
    with pytest.raises(StructuredOutputInvalid):  # without `cut`, the same text is refused
        replay(TOOLS_PLAN, [text])


@pytest.mark.parametrize(
    "text",
    [
        '{"tool": "get_weather", "arguments": {"city": "Par',
        '{"tool": "get_wea',
        '{"tool_calls": [{"tool": "get_weather", "arguments": {}}, {"tool": "li',
        '{"t',  # the first key can only be "tool" or "tool_calls": a call has begun
        '{"tool_c',
        '{"tool": ',
        '{"tool_calls": [{"tool": ',
    ],
)
def test_a_cut_off_tool_call_never_leaves(text: str) -> None:
    decoder = EnvelopeStreamDecoder(TOOLS_PLAN)
    decoder.feed(text)
    with pytest.raises(StructuredOutputInvalid):
        decoder.finish(cut=True)


@pytest.mark.parametrize("text", ['{"', '{"answ', '{"answer":', '{"answer": '])
def test_cut_off_before_anything_began_says_nothing_where_an_answer_may_come(text: str) -> None:
    """Neither an answer nor a call yet: under tool_choice auto an empty answer, cut off (as
    OpenAI answers a tiny max_tokens); where calls are required, nothing to return."""
    streamed, result = _cut(TOOLS_PLAN, text)
    assert (streamed, result.kind, result.content, result.complete) == ("", "answer", "", False)
    assert not result.tool_calls
    required = plan_chat(ChatInput(USER, tools=TOOLS, tool_choice="required"))
    decoder = EnvelopeStreamDecoder(required)
    decoder.feed(text)
    with pytest.raises(StructuredOutputInvalid):
        decoder.finish(cut=True)


def test_cut_off_structured_content_is_text_that_claims_nothing() -> None:
    streamed, result = _cut(STRUCTURED_PLAN, '{"answer": {"summary": "a b", "sco')
    assert (result.kind, result.content, result.parsed) == ("text", '{"summary": "a b", "sco', None)
    assert streamed == result.content and result.complete is False
    json_plan = plan_chat(ChatInput(USER, response_format=RF))
    streamed, result = _cut(json_plan, '{"summary": "a')
    assert (result.kind, result.content, streamed, result.complete) == (
        "text",
        '{"summary": "a',
        '{"summary": "a',
        False,
    )


def test_a_complete_output_is_unaffected_by_cut() -> None:
    text = '{"tool":"get_weather","arguments":{"city":"Paris"}}'
    decoder = EnvelopeStreamDecoder(TOOLS_PLAN)
    decoder.feed(text)
    _, result = decoder.finish(cut=True)
    assert result.kind == "tool_calls" and result.complete


@pytest.mark.parametrize(
    "text",
    [
        '<think>a {"b": 1} plan</think>{"summary": "x", "score": 1}',
        '  <think>\nhmm</think>{"summary": "x", "score": 1}',
        '{"summary": "<think>x</think>", "score": 1}',  # not leading: content
        "<thi",  # only looked like a tag
    ],
)
def test_a_leading_think_region_is_not_streamed_as_content(text: str) -> None:
    """Plan.parse keeps a leading <think> region out of the content; so does the stream,
    wherever the text is cut into deltas."""
    json_plan = plan_chat(ChatInput(USER, response_format=RF))
    for size in (1, 3, len(text)):
        decoder = EnvelopeStreamDecoder(json_plan)
        events: list[EnvelopeEvent] = []
        for i in range(0, len(text), size):
            events += decoder.feed(text[i : i + size])
        try:
            tail, result = decoder.finish(cut=True)
        except StructuredOutputInvalid:
            continue  # "<thi" is not JSON; nothing to compare
        streamed = "".join(e.text for e in events + tail if isinstance(e, ContentDelta))
        assert streamed == result.content


def test_cut_off_mid_thought_is_reasoning_not_content() -> None:
    text_plan = plan_chat(ChatInput(USER, regex="(yes|no)"))
    streamed, result = _cut(text_plan, "<think>still weighing the opti")
    assert (streamed, result.content, result.reasoning) == ("", "", "still weighing the opti")


def test_grammar_output_cut_off_claims_no_conformance() -> None:
    """Nothing re-checks a grammar's output here, so a cut one cannot be called complete."""
    ebnf_plan = plan_chat(ChatInput(USER, grammar='start: "abc"'))
    assert ebnf_plan.parse("a", cut=True).complete is False
    assert ebnf_plan.parse("abc").complete is True
