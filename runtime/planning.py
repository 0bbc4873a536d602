"""Request planning: an OpenAI chat request -> rendered engine messages + one constraint.

Pure (no I/O, no model): the gateway calls :func:`plan_chat` before anything is generated,
so every input error surfaces as a typed 4xx before a token is spent, and the plan's
``schema`` is what the receipt's manifest binds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import regex as regex_engine

from runtime.call_ids import CallIds
from runtime.closed_schema import closed_schema
from runtime.constraint import Constraint
from runtime.engines.base import ChatMessage
from runtime.errors import (
    BackendCannotCompile,
    ConflictingConstraints,
    InvalidGrammar,
    InvalidRegex,
    OutputLeftGrammar,
    RuntimeInputError,
    StructuredOutputInvalid,
)
from runtime.exact_json import load_json
from runtime.grammar_check import GRAMMAR_READERS, grammar_mismatch
from runtime.limits import DEFAULT_LIMITS, Limits
from runtime.messages import parse_messages
from runtime.output_parsing import (
    ParsedResponse,
    ToolCall,
    parse_envelope,
    parse_native_tool_call,
)
from runtime.regex_features import regex_problem, unenforceable_regex_feature
from runtime.renderers import (
    ToolPrompt,
    detect_family,
    get_renderer,
    thinks,
)
from runtime.renderers.base import json_answer_note
from runtime.schema_check import validate
from runtime.thinking import Enforcement, split_thinking
from runtime.tools import (
    RESPONSE_SCHEMA_PARAM,
    ResponseFormat,
    ToolChoice,
    ToolSpec,
    parse_response_format,
    parse_tool_choice,
    parse_tools_field,
)
from runtime.union_schema import union_schema

Mode = Literal["tools", "json", "regex", "ebnf", "text"]


@dataclass(frozen=True)
class ChatInput:
    """The planning-relevant fields of a chat completion request, as the client sent them."""

    messages: Any
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: Any = None  # None: OpenAI's default (true) when tools are given
    response_format: Any = None
    regex: Any = None  # extension field
    grammar: Any = None  # extension field (EBNF)
    model: str = ""


@dataclass(frozen=True)
class Plan:
    """Everything decided about one request before generation.

    ``schema`` is the JSON schema the manifest binds: the tool union, the response schema,
    or ``{"type": "object"}`` for json_object; None for regex/ebnf/text, whose binding is the
    constraint source itself.
    """

    messages: tuple[ChatMessage, ...]
    mode: Mode
    constraint: Constraint | None
    schema: dict[str, Any] | None
    renderer: str
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = False
    response_format: ResponseFormat | None = None
    tool_call_ids_answered: tuple[str, ...] = ()
    enforcement: Enforcement | None = None  # None: the constraint holds from the first token

    def parse(
        self,
        text: str,
        ids: CallIds | None = None,
        *,
        cut: bool = False,
        enforced_by: str | None = None,
    ) -> ParsedResponse:
        """The meaning of the model's ``text``; validates again and raises
        StructuredOutputInvalid when it does not hold. Pass the request's ``ids`` so a retry
        or a streamed parse gives each call the id it already has. ``cut``: the token limit
        or a stop string ended it, so grammar output is marked incomplete (and need only
        begin the grammar's output). ``enforced_by``: the backend that enforced the
        constraint; grammar output is read again only when that was llguidance
        (runtime.grammar_check says why).
        """
        reasoning, body = split_thinking(text)
        if self.mode == "ebnf" and enforced_by in GRAMMAR_READERS:
            # the grammar held from the first token unless a reasoning region came first
            reasoned = self.enforcement is not None and self.enforcement.reasoning
            self._check_grammar_output(body if reasoned else text, cut=cut)
        result = self._parse_body(body, ids or CallIds())
        if reasoning is not None:
            result = dataclasses.replace(result, reasoning=reasoning)
        if cut and self.mode == "ebnf":
            result = dataclasses.replace(result, complete=False)
        return result

    def _check_grammar_output(self, written: str, *, cut: bool) -> None:
        assert self.constraint is not None
        # a character the token limit cut in two is decoded as U+FFFD: not the model's text
        text = written.rstrip("\ufffd") if cut else written
        problem = grammar_mismatch(self.constraint.source, text, cut=cut)
        if problem:
            raise OutputLeftGrammar(
                problem, schema=None, raw_output=written, pointer="", param="grammar"
            )

    @property
    def answer_schema(self) -> dict[str, Any] | None:
        rf = self.response_format
        return rf.schema if rf is not None and rf.constrains else None

    def _parse_body(self, body: str, ids: CallIds) -> ParsedResponse:
        if self.mode == "json":
            assert self.schema is not None
            value = load_json(body, self.schema, param="response_format")
            validate(value, self.schema, body, param="response_format")
            return ParsedResponse("parsed", parsed=value, content=body)
        if self.mode == "regex":
            assert self.constraint is not None
            problem = _regex_mismatch(self.constraint.source, body)
            if problem:
                raise StructuredOutputInvalid(
                    problem, schema=None, raw_output=body, pointer="", param="regex"
                )
        if self.mode != "tools":
            return ParsedResponse("text", content=body)
        assert self.schema is not None and self.tool_choice is not None
        if body.lstrip().startswith("{"):
            return parse_envelope(
                body.strip(),
                self.tools,
                schema=self.schema,
                response_schema=self.answer_schema,
                ids=ids,
            )
        return self._parse_tagged(body, ids)

    def _parse_tagged(self, body: str, ids: CallIds) -> ParsedResponse:
        """Free text with calls in the family's tags: the thinking-model path, where only the
        tool-call region was constrained."""
        family = "llama" if self.renderer == "llama" else "qwen"  # hermes uses qwen tags
        result = parse_native_tool_call(body, family, self.tools, ids=ids)
        if result.kind == "tool_calls":
            validate(_as_envelope(result.tool_calls), self.schema or {}, body, param="tools")
            return result
        opener = "<function=" if family == "llama" else "<tool_call>"
        if opener in body:  # a call was begun but is not complete and valid: never an answer
            raise StructuredOutputInvalid(
                f"the output opens {opener} but holds no complete, valid tool call",
                schema=self.schema,
                raw_output=body,
                pointer="",
                param="tools",
            )
        answer = body.strip()
        if (
            self.tool_choice is not None
            and self.tool_choice.allows_answer
            and (self.answer_schema is None)
        ):
            return ParsedResponse("answer", answer=answer, content=answer)
        raise StructuredOutputInvalid(
            "the output holds neither a tool call nor the JSON envelope",
            schema=self.schema,
            raw_output=body,
            pointer="",
            param="tools",
        )


def plan_chat(
    chat: ChatInput,
    family: str | None = None,
    *,
    reasoning: bool | None = None,
    limits: Limits = DEFAULT_LIMITS,
) -> Plan:
    """Validate ``chat`` and decide its prompt and its single constraint.

    ``family`` overrides the renderer detected from ``chat.model``; ``reasoning`` overrides
    whether the model is a thinking model (detected from its name), whose ``<think>`` region
    stays free: see :func:`_enforcement`. Each schema is held to ``limits``' size and depth
    before it is checked further.
    """
    history = parse_messages(chat.messages)
    response_format = parse_response_format(chat.response_format, limits)
    _check_one_constraint(chat, response_format)
    renderer = get_renderer(family or detect_family(chat.model))
    thinking = thinks(chat.model, reasoning)
    answered = tuple(dict.fromkeys(m.tool_call_id for m in history if m.tool_call_id))
    if chat.tools is not None:
        tools = parse_tools_field(chat.tools, limits)
        choice = parse_tool_choice(chat.tool_choice, tools)
        # A named tool_choice is one call of that tool (OpenAI's "forced function", and
        # what vLLM's own named tool choice decodes), whatever parallel_tool_calls says.
        parallel = _parallel_flag(chat.parallel_tool_calls) and choice.mode != "named"
        if choice.mode != "none":
            answer_rf = response_format if response_format and response_format.constrains else None
            enforcement = _enforcement(
                thinking, renderer.name, choice, free_answer=answer_rf is None
            )
            if enforcement is not None and enforcement.mode == "triggered":
                # Only the inside of a tool-call tag is constrained; answers are the free text.
                required = ToolChoice("required", allowed=choice.allowed)
                schema = union_schema(tools, required, None, parallel)
            else:
                schema = union_schema(tools, choice, answer_rf, parallel)
            prompt = ToolPrompt(tools, choice, parallel, answer_rf)
            return Plan(
                messages=renderer.render(history, renderer.tool_block(prompt)),
                mode="tools",
                constraint=Constraint.json_schema(schema, kind="tools"),
                schema=schema,
                renderer=renderer.name,
                tools=tools,
                tool_choice=choice,
                parallel_tool_calls=parallel,
                response_format=response_format,
                tool_call_ids_answered=answered,
                enforcement=enforcement,
            )
    else:
        for param in ("tool_choice", "parallel_tool_calls"):
            if getattr(chat, param) is not None:
                raise RuntimeInputError(
                    f"'{param}' is only allowed when 'tools' are specified", param=param
                )
    # tool_choice "none" is planned as no tools (OpenAI: the model "generates a message"): no
    # envelope wraps the answer, so stop strings, max_tokens and usage mean what they mean
    # without tools, and the tools stay out of the prompt the model could answer from
    mode, constraint, schema, system_block = _single_constraint(chat, response_format)
    return Plan(
        messages=renderer.render(history, system_block),
        mode=mode,
        constraint=constraint,
        schema=schema,
        renderer=renderer.name,
        response_format=response_format,
        tool_call_ids_answered=answered,
        enforcement=_enforcement(thinking, renderer.name, None) if constraint else None,
    )


# Families whose models are trained to wrap calls in <tool_call>…</tool_call> (Hermes too).
_TAGGED_FAMILIES = ("qwen", "hermes")


def _enforcement(
    reasoning: bool, renderer: str, choice: ToolChoice | None, *, free_answer: bool = False
) -> Enforcement | None:
    """Where the grammar applies for a thinking model; None (from the first token) otherwise.

    tool_choice "auto" on a tag-trained family with a free-text answer is triggered: free
    reasoning and answer text, the grammar only inside ``<tool_call>`` (the approach of
    vLLM's triggered structural tags). Every other constraint, a response_format answer
    included, applies from the first token after the thinking region.
    """
    if not reasoning:
        return None
    if (
        free_answer
        and choice is not None
        and choice.mode == "auto"
        and renderer in _TAGGED_FAMILIES
    ):
        return Enforcement(mode="triggered", reasoning=True)
    return Enforcement(mode="always", reasoning=True)


def _single_constraint(
    chat: ChatInput, response_format: ResponseFormat | None
) -> tuple[Mode, Constraint | None, dict[str, Any] | None, str]:
    """Mode, constraint, bound schema and system note of a request without tools."""
    if response_format is not None and response_format.schema is not None:
        schema = closed_schema(response_format.schema, param=RESPONSE_SCHEMA_PARAM)
        note = json_answer_note(schema, response_format)
        return "json", Constraint.json_schema(schema), schema, note
    if chat.regex is not None:
        return "regex", _regex(chat.regex), None, ""
    if chat.grammar is not None:
        return "ebnf", _grammar(chat.grammar), None, ""
    return "text", None, None, ""


def _check_one_constraint(chat: ChatInput, response_format: ResponseFormat | None) -> None:
    given = [
        name
        for name, present in (
            ("response_format", response_format is not None and response_format.constrains),
            ("regex", chat.regex is not None),
            ("grammar", chat.grammar is not None),
        )
        if present
    ]
    if len(given) > 1:
        raise ConflictingConstraints(
            f"'{given[0]}' and '{given[1]}' cannot be combined: a request takes one output "
            "constraint",
            param=given[1],
        )
    if chat.tools is not None and given and given[0] != "response_format":
        raise ConflictingConstraints(
            f"'tools' and '{given[0]}' cannot be combined: with tools the output is held to "
            "the tool-call schema (response_format may be combined with tools)",
            param=given[0],
        )


def _parallel_flag(value: Any) -> bool:
    if value is None:
        return True
    if not isinstance(value, bool):
        raise RuntimeInputError(
            "'parallel_tool_calls' must be a boolean", param="parallel_tool_calls"
        )
    return value


REGEX_CHECK_TIMEOUT_S = 0.05


def _regex_mismatch(pattern: str, text: str) -> str | None:
    """Why ``text`` fails the regex, or None. Python's engine backtracks, and a client's
    regex such as ``(a|aa){40}b`` takes seconds on output built to miss it; the check runs
    on the event loop, so it has a deadline, and output it cannot clear in time fails."""
    try:
        if regex_engine.fullmatch(pattern, text, timeout=REGEX_CHECK_TIMEOUT_S) is not None:
            return None
    except TimeoutError:
        return (
            f"output could not be checked against the regex within {REGEX_CHECK_TIMEOUT_S} s"
            " (it backtracks heavily); nothing is returned unchecked"
        )
    return (
        "output does not match the regex (truncated by max_tokens or stop, or a backend that"
        " does not enforce all of it)"
    )


def _regex(pattern: Any) -> Constraint:
    if not isinstance(pattern, str) or not pattern:
        raise InvalidRegex("'regex' must be a non-empty string", param="regex")
    problem = regex_problem(pattern)
    if problem is not None:
        raise InvalidRegex(f"'regex' {problem}", param="regex")
    feature = unenforceable_regex_feature(pattern)
    if feature is not None:
        raise BackendCannotCompile(
            f"'regex' uses {feature}, which no grammar backend can enforce: rewrite it without",
            param="regex",
        )
    return Constraint.regex(pattern)


def _grammar(grammar: Any) -> Constraint:
    if not isinstance(grammar, str) or not grammar.strip():
        raise InvalidGrammar("'grammar' must be a non-empty EBNF string", param="grammar")
    return Constraint.ebnf(grammar)


def _as_envelope(calls: Sequence[ToolCall]) -> dict[str, Any]:
    items = [{"tool": c.name, "arguments": c.arguments} for c in calls]
    return items[0] if len(items) == 1 else {"tool_calls": items}


__all__ = ["ChatInput", "Mode", "Plan", "plan_chat"]
