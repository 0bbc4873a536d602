"""The enforcement state machine, alone and driving the logits processor, on the real SmolLM2
tokenizer's ids (it splits every tag into several tokens and merges across tag boundaries:
"</think><tool_call>" is '</', 'think', '><', 'tool', '_', 'call', '>')."""

from __future__ import annotations

import pytest
import torch
from grammar_testkit import smol_tokenizer

from runtime.backends import BackendChain
from runtime.constrained import ConstrainedLogitsProcessor, GrammarViolation
from runtime.constraint import Constraint
from runtime.thinking import Enforcement, EnforcementMachine, Phase, TagError

CITY = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
    "additionalProperties": False,
}
CALL = '{"city":"Paris"}'
AUTO = Enforcement(mode="triggered")


def pieces(text: str) -> list[str]:
    tok = smol_tokenizer()
    return [tok.decode([t]) for t in tok.encode(text, add_special_tokens=False)]


def feed_all(machine: EnforcementMachine, parts: list[str]) -> list[tuple[Phase, str | None]]:
    return [
        (machine.phase, machine.feed(p))
        if machine.phase not in (Phase.ENFORCED, Phase.DONE)
        else (machine.phase, None)
        for p in parts
    ]


# -- the machine over text ---------------------------------------------------------------


def test_always_mode_enforces_from_the_first_token():
    assert EnforcementMachine(Enforcement()).phase is Phase.ENFORCED


def test_always_mode_of_a_thinking_model_opens_with_the_forced_think_tag():
    machine = EnforcementMachine(Enforcement(reasoning=True))
    assert machine.phase is Phase.OPENING and machine.pending_forced_tag() == "<think>"
    machine.feed("<th")
    assert machine.phase is Phase.OPENING and machine.pending_forced_tag() == "ink>"
    with pytest.raises(TagError, match="expected the forced tag"):
        machine.feed("e")


def test_triggered_mode_starts_free_and_a_model_may_think_first():
    machine = EnforcementMachine(Enforcement(mode="triggered", reasoning=True))
    assert machine.phase is Phase.FREE
    assert machine.feed("No thinking, just a call: <tool_call>") == ""
    assert machine.phase is Phase.ENFORCED


def test_reasoning_region_is_free_until_think_end_split_across_tokens():
    machine = EnforcementMachine(Enforcement(reasoning=True))
    parts = pieces("<think>I need <tool_call> maybe</think>")
    assert len(parts) > 8  # the tags really are split
    results = [machine.feed(p) for p in parts]
    assert results[:-1] == [None] * (len(parts) - 1)
    assert results[-1] == "" and machine.phase is Phase.ENFORCED


def test_triggered_region_opens_closes_and_reopens():
    machine = EnforcementMachine(AUTO)
    for p in pieces("Let me check the weather."):
        assert machine.feed(p) is None and machine.phase is Phase.FREE
    parts = pieces("<tool_call>")
    assert [machine.feed(p) for p in parts] == [None] * (len(parts) - 1) + [""]
    assert machine.phase is Phase.ENFORCED
    machine.grammar_complete()
    assert machine.phase is Phase.CLOSING and machine.pending_forced_tag() == "</tool_call>"
    for p in pieces("</tool_call>"):
        machine.feed(p)
    assert machine.phase is Phase.FREE
    assert machine.feed("\n<tool_call>{") == "{" and machine.phase is Phase.ENFORCED


def test_tool_call_tag_inside_thinking_does_not_trigger():
    machine = EnforcementMachine(AUTO)
    for p in pieces("<think>should I <tool_call>? yes</think>ok "):
        assert machine.feed(p) is None
    assert machine.phase is Phase.FREE
    assert [machine.feed(p) for p in pieces("<tool_call>")][-1] == ""


def test_one_token_ending_thinking_and_starting_a_tool_call():
    parts = pieces("</think><tool_call>")
    assert "><" in parts
    machine = EnforcementMachine(Enforcement(mode="triggered", reasoning=True))
    phases = []
    for p in parts:
        machine.feed(p)
        phases.append(machine.phase)
    assert phases[parts.index("><")] is Phase.FREE  # thinking closed, tool tag half seen
    assert phases[-1] is Phase.ENFORCED


@pytest.mark.parametrize("cut", range(1, len("<tool_call>")))
def test_tag_split_at_every_boundary(cut):
    machine = EnforcementMachine(AUTO)
    text = 'see <tool_call>{"a":1}'
    assert machine.feed(text[: 4 + cut]) is None
    assert machine.feed(text[4 + cut :]) == '{"a":1}'


def test_near_miss_tags_do_not_trigger():
    machine = EnforcementMachine(AUTO)
    for p in pieces("<tool_cal> <tool call> </tool_call> <think"):
        assert machine.feed(p) is None
    assert machine.phase is Phase.FREE


def test_diverging_from_the_forced_end_tag_is_an_error():
    machine = EnforcementMachine(AUTO)
    machine.feed("<tool_call>")
    machine.grammar_complete()
    machine.feed("</tool")
    with pytest.raises(TagError, match="expected the forced tag"):
        machine.feed("box>")


# -- the machine driving the logits processor ----------------------------------------------


@pytest.fixture(scope="module")
def compiled():
    return BackendChain(smol_tokenizer()).compile(Constraint.json_schema(CITY))


class Drive:
    """Feed a transcript's real token ids through the processor as generate() would (one
    call per new token), recording per step whether the mask was off and EOS allowed."""

    def __init__(self, compiled, enforcement):
        tok = smol_tokenizer()
        self.tok = tok
        self.proc = ConstrainedLogitsProcessor(compiled.matcher(), tok, enforcement=enforcement)
        self.ids = tok.encode("prompt", add_special_tokens=False)
        self.free: list[bool] = []
        self.eos_ok: list[bool] = []
        self.scores = self._call()

    def _call(self) -> torch.Tensor:
        scores = self.proc(torch.tensor([self.ids]), torch.zeros(1, len(self.tok)))
        self.free.append(bool(torch.isfinite(scores).all()))
        self.eos_ok.append(bool(torch.isfinite(scores[0, self.tok.eos_token_id])))
        return scores

    def emit(self, token: int) -> None:
        assert torch.isfinite(self.scores[0, token]), f"token {self.tok.decode([token])!r} masked"
        self.ids.append(token)
        self.scores = self._call()

    def run(self, text: str) -> torch.Tensor:
        for token in self.tok.encode(text, add_special_tokens=False):
            self.emit(token)
        return self.scores

    def allowed(self, scores: torch.Tensor) -> list[str]:
        return [self.tok.decode([t]) for t in torch.isfinite(scores[0]).nonzero().flatten()]


def test_processor_auto_mode_free_then_enforced_then_forced_end_tag(compiled):
    drive = Drive(compiled, AUTO)
    opening = "I will look it up.<tool_call>"  # '.<' is one token here
    n_free = len(smol_tokenizer().encode(opening, add_special_tokens=False))
    scores = drive.run(opening + CALL)
    assert all(drive.free[:n_free])  # free text and the tag itself: no mask
    assert not any(drive.free[n_free:])  # the call: masked
    assert not any(drive.eos_ok[n_free:])  # no EOS inside a tool call
    assert drive.allowed(scores) == ["</"]  # grammar complete: the end tag is forced
    scores = drive.run("</tool_call>")
    assert drive.free[-1] and drive.eos_ok[-1]  # free again, may end
    drive.run('<tool_call>{"city":"Oslo"}</tool_call>')  # a second call gets a fresh grammar
    assert drive.free[-1]


def test_processor_blocks_a_call_that_breaks_the_schema(compiled):
    drive = Drive(compiled, AUTO)
    drive.run("<tool_call>")
    with pytest.raises(AssertionError, match="masked"):
        drive.run('{"town":"Paris"}')


def test_processor_reasoning_then_always_enforced(compiled):
    drive = Drive(compiled, Enforcement(reasoning=True))
    n_think = len(smol_tokenizer().encode("<think>hmm, JSON</think>", add_special_tokens=False))
    scores = drive.run("<think>hmm, JSON</think>" + CALL)
    assert not any(drive.eos_ok[:n_think])  # thinking may not end the answer
    assert all(not f for f in drive.free[n_think:])
    assert drive.allowed(scores) == [drive.tok.eos_token]  # complete: only EOS


def test_processor_forces_the_think_tag_before_free_thinking(compiled):
    drive = Drive(compiled, Enforcement(reasoning=True))
    assert "".join(drive.allowed(drive.scores)) == "<"  # only the tag's first token
    scores = drive.run("<think>")
    assert len(drive.allowed(scores)) == len(drive.tok) - 1  # free thinking, all but EOS
    assert not drive.eos_ok[-1]


def test_processor_feeds_grammar_text_sharing_a_token_with_the_tag():
    tok = smol_tokenizer()
    compiled = BackendChain(tok).compile(Constraint.json_schema({"type": "string"}))
    drive = Drive(compiled, AUTO)
    bridge = tok.convert_tokens_to_ids('>"')  # one token: the tag's end and the JSON's start
    ids = tok.encode("<tool_call", add_special_tokens=False) + [bridge]
    for token in ids:
        drive.emit(token)
    scores = drive.run('ab"')
    assert drive.allowed(scores) == ["</"]


def test_processor_without_enforcement_masks_from_the_start_and_fails_closed(compiled):
    tok = smol_tokenizer()
    proc = ConstrainedLogitsProcessor(compiled.matcher(), tok)
    ids = tok.encode("prompt", add_special_tokens=False)
    scores = proc(torch.tensor([ids]), torch.zeros(1, len(tok) + 64))  # padded embedding rows
    assert not torch.isfinite(scores[0, len(tok) :]).any()
    assert not torch.isfinite(scores[0, tok.eos_token_id])
    with pytest.raises(GrammarViolation):
        proc(
            torch.tensor([ids + tok.encode("hello", add_special_tokens=False)]),
            torch.zeros(1, len(tok)),
        )
