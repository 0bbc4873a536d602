"""When the grammar applies: the enforcement state machine over generated text.

A grammar constrains only part of some outputs:

* thinking regions (``<think>…</think>``) are always free;
* tool_choice "auto" (``mode="triggered"``): free text until the tool-call start tag, the
  grammar from just after it until the grammar completes, then the end tag, then free again
  (another tool call may follow);
* "required", a named tool, response_format, regex and grammar constraints
  (``mode="always"``): the grammar applies from the first character after any thinking
  region, to the end.

The machine sees text, not token ids, because tags are split across tokens differently by
every tokenizer (SmolLM2 splits ``<tool_call>`` into ``<``, ``tool``, ``_``, ``call``, ``>``
and merges ``></`` boundaries). It keeps a tail of the last few characters so a tag split
across any number of tokens is found. The logits processor (runtime/constrained.py) feeds it
the text of every token generated while the grammar is suspended.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Literal

from runtime.errors import EngineFault


class Phase(enum.Enum):
    OPENING = "opening"  # always mode of a thinking model: the think start tag is being forced
    THINKING = "thinking"  # inside <think>…</think>: free
    FREE = "free"  # triggered mode outside a tool call: free
    ENFORCED = "enforced"  # the grammar decides every token
    CLOSING = "closing"  # triggered mode: grammar complete, the end tag is being emitted
    DONE = "done"  # always mode: grammar complete, only EOS may follow


THINK_OPEN, THINK_CLOSE = "<think>", "</think>"  # a thinking model's reasoning region
_THINK = re.compile(rf"\s*{THINK_OPEN}(?P<reasoning>.*?)(?:{THINK_CLOSE}|\Z)", re.DOTALL)


def split_thinking(text: str) -> tuple[str | None, str]:
    """(reasoning, rest) of an output that opens with a ``<think>`` region, else (None, text).
    A region never closed (cut off mid-thought) is all reasoning: none of it is content."""
    thinking = _THINK.match(text)
    if thinking is None:
        return None, text
    return thinking["reasoning"].strip(), text[thinking.end() :]


@dataclass(frozen=True)
class Enforcement:
    """How a constraint applies to one generation.

    ``reasoning`` (a thinking model): in "always" mode the output is made to open with
    ``think_start`` (forced, as vLLM's structural tag does), is free until ``think_end``, and
    the grammar holds after it. In "triggered" mode free text is watched for ``think_start``
    anyway, so a model may think or not; a trigger tag inside its thinking does not count.
    """

    mode: Literal["always", "triggered"] = "always"
    reasoning: bool = False
    think_start: str = THINK_OPEN
    think_end: str = THINK_CLOSE
    trigger_start: str = "<tool_call>"
    trigger_end: str = "</tool_call>"


class TagError(EngineFault):
    """The generated text broke the tag protocol (e.g. diverged from a forced end tag)."""


class EnforcementMachine:
    def __init__(self, enforcement: Enforcement):
        self.config = enforcement
        self._tail = ""  # suspended text not yet ruled out as the start of a tag
        self._closing = ""  # OPENING / CLOSING: how much of the forced tag has been emitted
        self._longest_tag = max(
            len(enforcement.think_start), len(enforcement.think_end), len(enforcement.trigger_start)
        )
        if enforcement.mode == "triggered":
            self.phase = Phase.FREE
        elif enforcement.reasoning:
            self.phase = Phase.OPENING
        else:
            self.phase = Phase.ENFORCED

    def feed(self, text: str) -> str | None:
        """Consume text generated while the grammar is suspended.

        Returns None while the grammar stays suspended; when a tag switches it on, returns
        the rest of ``text`` after the tag (possibly ""), which belongs to the grammar.
        """
        if self.phase in (Phase.ENFORCED, Phase.DONE):
            raise TagError(f"text fed to the tag machine while {self.phase.value}")
        buf, self._tail = self._tail + text, ""
        while True:
            if self.phase in (Phase.OPENING, Phase.CLOSING):
                forced = self.phase
                buf = self._emit_forced(buf)
                if self.phase is forced:
                    return None
            hits = [(i, tag, nxt) for tag, nxt in self._watched() if (i := buf.find(tag)) >= 0]
            if not hits:
                self._tail = buf[-(self._longest_tag - 1) :] if self._longest_tag > 1 else ""
                return None
            i, tag, nxt = min(hits, key=lambda h: h[0])
            buf, self.phase = buf[i + len(tag) :], nxt
            if nxt is Phase.ENFORCED:
                return buf

    def grammar_complete(self) -> None:
        """The grammar has matched a complete value: close the tool-call region or finish."""
        if self.phase is not Phase.ENFORCED:
            raise TagError(f"grammar completed while {self.phase.value}")
        if self.config.mode == "triggered":
            self.phase, self._closing = Phase.CLOSING, ""
        else:
            self.phase = Phase.DONE

    def pending_forced_tag(self) -> str:
        """OPENING / CLOSING: the part of the forced tag still to be generated."""
        tag = self.config.think_start if self.phase is Phase.OPENING else self.config.trigger_end
        return tag[len(self._closing) :]

    def _watched(self) -> list[tuple[str, Phase]]:
        """The tags that end the current suspended phase, each with the phase it leads to."""
        c = self.config
        if self.phase is Phase.THINKING:
            return [(c.think_end, Phase.ENFORCED if c.mode == "always" else Phase.FREE)]
        return [(c.think_start, Phase.THINKING), (c.trigger_start, Phase.ENFORCED)]

    def _emit_forced(self, buf: str) -> str:
        """Match ``buf`` against the rest of the forced tag; return what follows the tag."""
        rest = self.pending_forced_tag()
        if buf.startswith(rest):
            self.phase = Phase.THINKING if self.phase is Phase.OPENING else Phase.FREE
            self._closing = ""
            return buf[len(rest) :]
        if rest.startswith(buf):
            self._closing += buf
            return ""
        raise TagError(f"expected the forced tag {rest!r}, got {buf!r}")
