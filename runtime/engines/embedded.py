"""The embedded engine: a local transformers model decoding under a grammar, in-process.

The decode loop is our own (a KV-cached forward per token) rather than ``model.generate``:
masking, streaming and stop strings are then three plain steps of one loop, and the loop
stops the moment the grammar is complete instead of spending a forward pass on EOS.

Decoding runs on one worker thread: a 2-core CPU gains nothing from two concurrent
generations, and the event loop must stay free for the gateway. Requests queue on that thread
in arrival order. Greedy decoding (temperature 0) and seeded sampling are deterministic on a
rerun, which is what receipt replay relies on.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from runtime.backends.base import CompiledGrammar, special_tokens
from runtime.backends.registry import BackendChain
from runtime.constrained import post_hoc_retry_json, processor_of
from runtime.constraint import Constraint
from runtime.deep_stack import DeepStackExecutor
from runtime.engines.base import (
    NO_BACKEND,
    ChatMessage,
    EngineIdentity,
    FinishReason,
    Generation,
    Sampling,
    StreamEvent,
    TextDelta,
    pinned_order,
)
from runtime.errors import (
    BackendCannotCompile,
    EngineConfigError,
    EngineFault,
    EngineUnavailable,
    RuntimeInputError,
)
from runtime.grammar_cache import GrammarCache
from runtime.limits import DEFAULT_LIMITS, Limits
from runtime.model_store import ensure_bundled_model, model_digests
from runtime.thinking import Enforcement

POST_HOC_RETRIES = 2


@dataclass(frozen=True)
class ModelSource:
    """Where the weights come from: an HF directory, or a GGUF file inside a directory."""

    directory: Path
    gguf_file: str | None
    name: str

    @property
    def digest_path(self) -> Path:
        return self.directory / self.gguf_file if self.gguf_file else self.directory


def resolve_model(model_path: Path | str | None) -> ModelSource:
    """The bundled model (fetched on first use) or a local HF directory or GGUF path; any
    other path is the operator's mistake (EngineConfigError), not an outage."""
    if model_path is None:
        directory = ensure_bundled_model()
        return ModelSource(directory, None, directory.name)
    path = Path(model_path).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return ModelSource(path.parent, path.name, path.stem)
    if path.is_dir() and (path / "config.json").is_file():
        return ModelSource(path, None, path.name)
    raise EngineConfigError(
        f"setting 'model': {path} is neither an HF model directory nor a .gguf file"
    )


@contextlib.contextmanager
def _refused_if_broken(source: ModelSource, named: str) -> Iterator[None]:
    """A model whose files do not load (not GGUF inside, a truncated safetensors file)
    raises whatever transformers, safetensors or the GGUF reader raise: the operator's
    files, so EngineConfigError (exit 2, one line) naming them, not a traceback. Running
    out of memory is the machine's, not the files'."""
    try:
        yield
    except MemoryError:
        raise
    except Exception as exc:
        text = str(exc).strip()
        reason = f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__
        raise EngineConfigError(f"{named}: {source.digest_path} does not load: {reason}") from exc


def default_threads() -> int:
    """Half the cores: the other half keeps the gateway, grammar compiles and the database
    responsive (measured here: 2 torch threads on a busy 2-core machine ran 3x slower)."""
    return max(1, (os.cpu_count() or 2) // 2)


class EmbeddedEngine:
    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        identity: EngineIdentity,
        grammars: GrammarCache,
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.identity = identity
        self.grammars = grammars
        self._eos_ids = _eos_ids(model, tokenizer)
        self._vocab = len(tokenizer)
        self._controls = tuple(special_tokens(tokenizer).values())
        self._worker = DeepStackExecutor(max_workers=1, thread_name_prefix="decode")
        self._closed = False

    @classmethod
    def load(
        cls,
        model_path: Path | str | None = None,
        *,
        threads: int | None = None,
        limits: Limits = DEFAULT_LIMITS,
    ) -> EmbeddedEngine:
        """Load the model and tokenizer and set up the grammar backends (blocking, seconds).
        ``limits`` bound every constraint compiled: the gateway passes its configured ones.
        The grammar backends are the default order or ``CALLPROOF_BACKENDS``."""
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        source = resolve_model(model_path)
        torch.set_num_threads(threads or default_threads())
        hf_logging.disable_progress_bar()  # bars on stderr would garble CLI and JSON logs
        kwargs: dict[str, Any] = {"gguf_file": source.gguf_file} if source.gguf_file else {}
        named = "setting 'model'" if model_path is not None else "the bundled model"
        with _refused_if_broken(source, named):
            tokenizer = AutoTokenizer.from_pretrained(source.directory, **kwargs)
        chain = BackendChain(tokenizer, limits=limits)  # a bad backend order fails fast
        with _refused_if_broken(source, named):
            model = AutoModelForCausalLM.from_pretrained(
                source.directory, dtype=torch.float32, **kwargs
            ).eval()
        digests = model_digests(source.digest_path)
        identity = EngineIdentity(
            model=source.name,
            weights_digest=digests.weights,
            tokenizer_digest=digests.tokenizer,
            engine="embedded",
            backends=tuple(chain.names),
        )
        return cls(model, tokenizer, identity, GrammarCache(chain))

    async def generate(
        self,
        messages: Sequence[ChatMessage],
        constraint: Constraint | None,
        sampling: Sampling,
        *,
        enforcement: Enforcement | None = None,
        backend: str | None = None,
    ) -> Generation:
        async for event in self.stream(
            messages, constraint, sampling, enforcement=enforcement, backend=backend
        ):
            if isinstance(event, Generation):
                return event
        raise EngineFault("the decode loop ended without a result")

    async def stream(
        self,
        messages: Sequence[ChatMessage],
        constraint: Constraint | None,
        sampling: Sampling,
        *,
        enforcement: Enforcement | None = None,
        backend: str | None = None,
    ) -> AsyncIterator[StreamEvent]:
        """Text deltas as tokens are decoded, then one final Generation."""
        if self._closed:
            raise EngineUnavailable("the embedded engine is closed")
        # Off the event loop: a 1 MB message takes the tokenizer over a second.
        prompt = await asyncio.to_thread(self.encode, messages)
        fitted = self._fit(prompt, sampling)
        try:
            grammar = (
                await self.grammars.aget(constraint, pinned_order(self.identity, backend))
                if constraint is not None
                else None
            )
        except BackendCannotCompile:
            if constraint is None or not constraint.is_json:
                raise
            generation = await self._post_hoc(messages, constraint, sampling)
            yield TextDelta(generation.text)
            yield generation
            return
        async for event in self._run(prompt, grammar, fitted, enforcement):
            yield event

    async def ready(self) -> bool:
        return not self._closed

    def grammar_stats(self) -> dict[str, dict[str, float]]:
        return self.grammars.stats()

    async def aclose(self) -> None:
        self._closed = True
        self._worker.shutdown(wait=False, cancel_futures=True)
        self.grammars.close()

    def encode(self, messages: Sequence[ChatMessage]) -> list[int]:
        """Prompt token ids through the tokenizer's own chat template. A message's text is
        text: one holding a control token's spelling ("<|im_end|>" in a tool result) gets
        the tokens of those characters, never the control token, which would let it end its
        turn and write a system or assistant turn of its own."""
        chat = [{"role": m.role, "content": m.content} for m in messages]
        if not chat:
            raise RuntimeInputError("messages must not be empty", param="messages")
        if self.tokenizer.chat_template is None:
            text = "".join(f"{m['role']}: {m['content']}\n" for m in chat) + "assistant: "
            return list(self.tokenizer(text, split_special_tokens=True)["input_ids"])
        if any(control in m["content"] for m in chat for control in self._controls):
            return self._encode_spelled_controls(chat)
        encoded = self.tokenizer.apply_chat_template(
            chat, add_generation_prompt=True, return_dict=True
        )
        return list(encoded["input_ids"])

    def _encode_spelled_controls(self, chat: list[dict[str, str]]) -> list[int]:
        """The template rendered around placeholders, its own text tokenized as usual and
        each message's text with control tokens read as characters."""
        marks = [
            f"\ue000{i}\ue001" for i in range(len(chat))
        ]  # private use: no template alters them
        rendered = self.tokenizer.apply_chat_template(
            [{**m, "content": mark} for m, mark in zip(chat, marks, strict=True)],
            add_generation_prompt=True,
            tokenize=False,
        )
        ids: list[int] = []
        rest = rendered
        for message, mark in zip(chat, marks, strict=True):
            template, found, rest = rest.partition(mark)
            if not found:
                raise EngineFault(
                    f"the chat template does not print message text as given: {mark!r}"
                )
            ids += self.tokenizer(template, add_special_tokens=False)["input_ids"]
            ids += self._text_ids(message["content"])
        return ids + self.tokenizer(rest, add_special_tokens=False)["input_ids"]

    def _text_ids(self, text: str) -> list[int]:
        return list(
            self.tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        )

    def _fit(self, prompt: list[int], sampling: Sampling) -> Sampling:
        """``sampling`` with ``max_tokens`` lowered to the room the prompt leaves in the
        context window, as vLLM does, so both engines answer a long conversation alike (the
        receipt keeps the requested figure; a replay lowers it the same way)."""
        limit = getattr(self.model.config, "max_position_embeddings", None)
        if not limit or len(prompt) + sampling.max_tokens <= limit:
            return sampling
        if len(prompt) >= limit:
            raise RuntimeInputError(
                f"this model's maximum context length is {limit} tokens; the messages alone "
                f"are {len(prompt)}: shorten the messages",
                param="messages",
                code="context_length_exceeded",
            )
        return replace(sampling, max_tokens=limit - len(prompt))

    async def _post_hoc(
        self, messages: Sequence[ChatMessage], constraint: Constraint, sampling: Sampling
    ) -> Generation:
        """No backend can compile this schema: decode freely, validate, re-prompt with the
        error. Only the validated JSON value is returned (never streamed before it validates,
        stripped of any prose around it); otherwise StructuredOutputInvalid with the schema,
        the raw output and the failing JSON pointer, naming the constraint's field."""
        schema = constraint.schema()
        history = list(messages[:-1]) if messages[-1].role == "user" else list(messages)
        question = messages[-1].content if messages[-1].role == "user" else ""
        attempts: list[Generation] = []
        cancelled = threading.Event()  # set when the caller is gone: stop at the next token

        def attempt(prompt_text: str) -> str:
            if cancelled.is_set():
                raise asyncio.CancelledError  # no retry for a caller who left
            prompt = self.encode([*history, ChatMessage("user", prompt_text)])
            fitted = self._fit(prompt, sampling)
            attempts.append(self._decode(prompt, None, fitted, None, lambda _: None, cancelled))
            return attempts[-1].text

        loop = asyncio.get_running_loop()
        try:
            parsed = await loop.run_in_executor(
                self._worker,
                functools.partial(
                    post_hoc_retry_json,
                    attempt,
                    question,
                    schema,
                    POST_HOC_RETRIES,
                    param=constraint.param,
                ),
            )
        finally:
            cancelled.set()
        last = attempts[-1]
        return Generation(
            text=json.dumps(parsed, ensure_ascii=False, separators=(",", ":")),  # no prose around
            prompt_tokens=sum(a.prompt_tokens for a in attempts),
            completion_tokens=sum(a.completion_tokens for a in attempts),
            finish_reason=last.finish_reason,
            backend=NO_BACKEND,
            fallback=f"post_hoc_retry:{len(attempts)}",
        )

    async def _run(
        self,
        prompt: list[int],
        grammar: CompiledGrammar | None,
        sampling: Sampling,
        enforcement: Enforcement | None,
    ) -> AsyncIterator[StreamEvent]:
        """Bridge the worker thread's deltas into this coroutine; a consumer that stops
        iterating (client gone) cancels the decode at the next token."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[str | Generation | BaseException] = asyncio.Queue()
        cancelled = threading.Event()

        def emit(item: str | Generation | BaseException) -> None:
            if not cancelled.is_set():  # nobody listens any more (its loop may be closed)
                loop.call_soon_threadsafe(queue.put_nowait, item)

        def work() -> None:
            try:
                emit(self._decode(prompt, grammar, sampling, enforcement, emit, cancelled))
            except BaseException as exc:  # noqa: BLE001 - re-raised in the awaiting coroutine
                emit(exc)

        self._worker.submit(work)
        try:
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                if isinstance(item, Generation):
                    yield item
                    return
                yield TextDelta(item)
        finally:
            cancelled.set()

    def _decode(
        self,
        prompt: list[int],
        grammar: CompiledGrammar | None,
        sampling: Sampling,
        enforcement: Enforcement | None,
        emit: Callable[[str], None],
        cancelled: threading.Event,
    ) -> Generation:
        import torch
        from transformers import DynamicCache

        processor = (
            processor_of(
                grammar, self.tokenizer, enforcement=enforcement, eos_token_ids=self._eos_ids
            )
            if grammar is not None
            else None
        )
        generator = _generator(sampling)
        past = DynamicCache(config=self.model.config)
        tokens: list[int] = []
        text, sent = "", 0
        stops = _StopScanner(sampling.stop)
        finish: FinishReason = "length"
        matched: str | None = None
        step_input = torch.tensor([prompt])
        with torch.inference_mode():
            while len(tokens) < sampling.max_tokens and not cancelled.is_set():
                out = self.model(
                    input_ids=step_input, past_key_values=past, use_cache=True, logits_to_keep=1
                )
                logits = out.logits[:, -1, :].float()
                if processor is not None:  # it reads the last token of step_input to advance
                    logits = processor(step_input, logits)
                token = _pick(logits[0, : self._vocab], sampling, generator)
                if token in self._eos_ids:
                    finish = "stop"
                    break
                tokens.append(token)
                text = self.tokenizer.decode(tokens, skip_special_tokens=True)
                cut = stops.find(text)
                if cut is not None:
                    matched = next(s for s in stops.stops if text.startswith(s, cut))
                    text, finish = text[:cut], "stop"
                    break
                safe = stops.safe_length(text)
                if safe > sent:
                    emit(text[sent:safe])
                    sent = safe
                step_input = torch.tensor([[token]])
            if finish == "length" and tokens and processor is not None and not cancelled.is_set():
                finish = "stop" if processor.complete_after(tokens[-1]) else "length"
        # A decode that ends (limit, EOS, cancel) inside a character's bytes: that half is not text
        text = text[: whole_characters(text)]
        if len(text) > sent:
            emit(text[sent:])
        return Generation(
            text=text,
            prompt_tokens=len(prompt),
            completion_tokens=len(tokens),
            finish_reason=finish,
            backend=grammar.backend if grammar is not None else NO_BACKEND,
            matched_stop=matched,
        )


class _StopScanner:
    """Finds stop strings in the growing text and says how much text is safe to stream:
    a tail that could still become a stop string (or is half a UTF-8 character) is held."""

    def __init__(self, stops: Sequence[str]):
        self.stops = tuple(s for s in stops if s)
        self._longest = max((len(s) for s in self.stops), default=0)

    def find(self, text: str) -> int | None:
        hits = [i for s in self.stops if (i := text.find(s)) >= 0]
        return min(hits) if hits else None

    def safe_length(self, text: str) -> int:
        end = whole_characters(text)
        for k in range(min(self._longest - 1, end), 0, -1):
            tail = text[end - k : end]
            if any(s.startswith(tail) for s in self.stops):
                return end - k
        return end


def whole_characters(text: str) -> int:
    """Where the decoded text stops being whole characters: tokens that end inside a UTF-8
    sequence decode to trailing U+FFFD until the next token completes it."""
    end = len(text)
    while end and text[end - 1] == "\ufffd":
        end -= 1
    return end


def _generator(sampling: Sampling) -> Any:
    """A private RNG per request: seeded -> the same draws on every rerun."""
    import torch

    if sampling.temperature == 0:
        return None
    generator = torch.Generator()
    if sampling.seed is None:
        generator.seed()
    else:
        generator.manual_seed(sampling.seed)
    return generator


# Below this a temperature is greedy (as vLLM's _SAMPLING_EPS): dividing the logits by
# 1e-300 made them infinite and the probabilities NaN.
_SAMPLING_EPS = 1e-5


def _pick(logits: Any, sampling: Sampling, generator: Any) -> int:
    """Greedy at temperature 0, else nucleus sampling from the request's own generator. The
    nucleus always holds the likeliest token (a top_p of 1e-300 is 0 in float32)."""
    import torch

    if sampling.temperature < _SAMPLING_EPS:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits / sampling.temperature, dim=-1)
    if sampling.top_p < 1:
        sorted_probs, order = torch.sort(probs, descending=True)
        keep = torch.cumsum(sorted_probs, dim=-1) - sorted_probs < sampling.top_p
        keep[0] = True
        probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_probs[keep])
    return int(torch.multinomial(probs, 1, generator=generator))


def _eos_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    """Every id that ends a turn: the tokenizer's EOS and the generation config's list."""
    ids: set[int] = set()
    configured = getattr(model.generation_config, "eos_token_id", None)
    if isinstance(configured, int):
        ids.add(configured)
    elif configured:
        ids.update(configured)
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return frozenset(ids)
