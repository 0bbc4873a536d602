"""The engine interface: what the gateway needs from a decoding runtime.

An engine takes plain chat messages (tools already rendered into them by a renderer), at
most one constraint, and sampling parameters, and returns text. Two implementations:
embedded (transformers + a grammar backend, in-process) and vllm (HTTP client of a vLLM
server doing structured outputs). Faults raise runtime.errors.EngineError subclasses.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from runtime.constraint import Constraint
from runtime.errors import EngineFault, RuntimeInputError
from runtime.thinking import Enforcement

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class Sampling:
    """Decoding parameters; temperature 0 means greedy (deterministic, replayable)."""

    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 256
    seed: int | None = None
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # Checked here so every engine and the CLI refuse bad values before any model work.
        if self.max_tokens < 1:
            raise RuntimeInputError(
                f"max_tokens must be at least 1, not {self.max_tokens}", param="max_tokens"
            )
        if self.temperature < 0:
            raise RuntimeInputError(
                f"temperature must not be negative, not {self.temperature}", param="temperature"
            )
        if not 0 <= self.top_p <= 1:
            raise RuntimeInputError(f"top_p must be in [0, 1], not {self.top_p}", param="top_p")

    def as_manifest(self) -> dict[str, object]:
        return {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_tokens": self.max_tokens,
            "seed": self.seed,
            "stop": list(self.stop),
        }


@dataclass(frozen=True)
class EngineIdentity:
    """What the manifest binds about the engine that produced an output."""

    model: str
    weights_digest: str | None
    tokenizer_digest: str | None
    engine: str  # "embedded" | "vllm"
    backends: tuple[str, ...]  # grammar backends that may enforce a constraint, in the order tried

    @property
    def backend(self) -> str:
        """The first choice: what enforces every constraint it can compile."""
        return self.backends[0]


def pinned_order(identity: EngineIdentity, backend: str | None) -> tuple[str, ...] | None:
    """The backends to try for Engine.generate's ``backend``: itself alone, or None for the
    identity's order. One the engine does not have is the caller's bug."""
    if backend is None:
        return None
    if backend not in identity.backends:
        raise EngineFault(
            f"grammar backend {backend!r} asked for, but this engine has {identity.backends}"
        )
    return (backend,)


NO_BACKEND = "none"
"""Generation.backend (and a manifest's) when no constraint was enforced: free text."""


@dataclass(frozen=True)
class Generation:
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: FinishReason
    backend: str  # backend that actually enforced this request's constraint (NO_BACKEND if free)
    fallback: str | None = None  # e.g. "post_hoc_retry:2" when no backend could compile it
    matched_stop: str | None = None
    """The stop string that ended the output (finish_reason "stop"); None when EOS, the
    grammar or the token limit ended it: only this says the output was cut short."""

    @property
    def cut(self) -> bool:
        """Whether the token limit or a stop string ended the output (before whatever
        constrained it was done, if it fails its check)."""
        return self.finish_reason == "length" or self.matched_stop is not None


@dataclass(frozen=True)
class TextDelta:
    text: str


StreamEvent = TextDelta | Generation  # deltas, then exactly one final Generation


@dataclass(frozen=True)
class ChatMessage:
    role: Literal["system", "user", "assistant"]
    content: str


class Engine(Protocol):
    identity: EngineIdentity

    async def generate(
        self,
        messages: Sequence[ChatMessage],
        constraint: Constraint | None,
        sampling: Sampling,
        *,
        enforcement: Enforcement | None = None,
        backend: str | None = None,
    ) -> Generation:
        """``enforcement`` says where the constraint applies (thinking regions, triggered
        tool-call tags); None: from the first token to the end. ``backend``, one of
        ``identity.backends``, is the only one tried (a replay runs on its receipt's);
        None: the identity's order."""
        ...

    def stream(
        self,
        messages: Sequence[ChatMessage],
        constraint: Constraint | None,
        sampling: Sampling,
        *,
        enforcement: Enforcement | None = None,
        backend: str | None = None,
    ) -> AsyncIterator[StreamEvent]: ...

    async def ready(self) -> bool:
        """True when the engine can serve a request now (model loaded / server healthy)."""
        ...

    def grammar_stats(self) -> dict[str, dict[str, float]] | None:
        """The in-process grammar cache's figures by constraint kind (hits, misses, compiles,
        compile ms) for /metrics; None when grammars compile elsewhere (a vLLM server)."""
        ...

    async def aclose(self) -> None: ...


__all__ = [
    "ChatMessage",
    "Engine",
    "EngineIdentity",
    "FinishReason",
    "Generation",
    "Sampling",
    "StreamEvent",
    "TextDelta",
]
