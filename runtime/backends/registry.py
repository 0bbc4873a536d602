"""Which grammar backends exist here, in what order, and falling through between them.

The default order comes from bench.compile and bench.constrained (docs/backends.md):
llguidance compiles in milliseconds and masks fastest per token here, xgrammar is close,
lm-format-enforcer has no grammars and a slow mask. Outlines is installed but not in the
default order: its vocabulary-wide DFA build costs seconds to minutes and gigabytes for a
few hundred bytes of schema, which any agent key could send. ``CALLPROOF_BACKENDS`` (comma
separated names) overrides the order.
"""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Sequence
from typing import Any

from runtime.backends.base import CompiledGrammar, GrammarBackend, tokenizer_digest
from runtime.constraint import Constraint, validate_constraint
from runtime.errors import BackendCannotCompile, EngineConfigError
from runtime.limits import DEFAULT_LIMITS, Limits, check_constraint

DEFAULT_ORDER = ("llguidance", "xgrammar", "lm-format-enforcer")
ENV_ORDER = "CALLPROOF_BACKENDS"

# name -> (module that implements it, class name, import that proves it is installed)
_BACKENDS = {
    "llguidance": ("runtime.backends.llguidance", "LLGuidanceBackend", "llguidance"),
    "xgrammar": ("runtime.backends.xgrammar", "XGrammarBackend", "xgrammar"),
    "lm-format-enforcer": (
        "runtime.backends.lm_format_enforcer",
        "LMFormatEnforcerBackend",
        "lmformatenforcer",
    ),
    "outlines": ("runtime.backends.outlines", "OutlinesBackend", "outlines_core"),  # opt-in
}


def available_backends() -> list[str]:
    """Backend names whose library imports here (all known ones, the default order first)."""
    found = []
    for name in _BACKENDS:
        try:
            importlib.import_module(_BACKENDS[name][2])
        except ImportError:
            continue
        found.append(name)
    return found


def backend_order(order: Sequence[str] | str | None = None) -> list[str]:
    """The configured order: the argument, else $CALLPROOF_BACKENDS, else the default;
    names that are not installed are dropped, unknown names are an error."""
    source = "the backend order"
    if order is None:
        order = os.environ.get(ENV_ORDER) or DEFAULT_ORDER
        source = ENV_ORDER if os.environ.get(ENV_ORDER) else "the default backend order"
    if isinstance(order, str):
        order = [n.strip() for n in order.split(",") if n.strip()]
    unknown = [n for n in order if n not in _BACKENDS]
    if unknown:
        raise EngineConfigError(
            f"{source} names unknown grammar backend(s) {unknown}; known: {list(_BACKENDS)}"
        )
    installed = set(available_backends())
    chosen = [n for n in order if n in installed]
    if not chosen:
        raise EngineConfigError(
            f"none of the grammar backends in {source} ({list(order)}) is installed"
        )
    return chosen


def make_backend(name: str, tokenizer: Any) -> GrammarBackend:
    module, cls, _ = _BACKENDS[name]
    return getattr(importlib.import_module(module), cls)(tokenizer)


class BackendChain:
    """The backends for one tokenizer in preference order; compile falls through.

    Backends are built lazily: a tokenizer conversion costs up to a second per backend, and
    most constraints never get past the first.
    """

    def __init__(
        self,
        tokenizer: Any,
        order: Sequence[str] | str | None = None,
        limits: Limits = DEFAULT_LIMITS,
    ):
        self.tokenizer = tokenizer
        self.limits = limits
        self.names: tuple[str, ...] = tuple(backend_order(order))
        self.tokenizer_digest = tokenizer_digest(tokenizer)
        self._built: dict[str, GrammarBackend] = {}
        self._lock = threading.Lock()  # the cache compiles from several threads

    def backend(self, name: str) -> GrammarBackend:
        with self._lock:
            if name not in self._built:
                self._built[name] = make_backend(name, self.tokenizer)
            return self._built[name]

    def compile(
        self, constraint: Constraint, order: Sequence[str] | None = None
    ) -> CompiledGrammar:
        """Check limits and syntax once (bad input raises its typed error at once), then the
        first backend that can compile wins; BackendCannotCompile lists every reason.
        ``order`` overrides the chain's (a replay pins the backend its receipt names)."""
        check_constraint(constraint, self.limits)
        validate_constraint(constraint)
        reasons = []
        for name in order or self.names:
            try:
                return self.backend(name).compile(constraint)
            except BackendCannotCompile as exc:
                reasons.append(str(exc))
        raise BackendCannotCompile(
            "no grammar backend can compile this constraint: " + " | ".join(reasons),
            param=constraint.param,
        )
