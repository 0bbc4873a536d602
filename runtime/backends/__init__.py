"""Grammar backends behind one interface (base.py), chosen and ordered by registry.py."""

from runtime.backends.base import CompiledGrammar, GrammarBackend, GrammarMatcher
from runtime.backends.registry import (
    BackendChain,
    available_backends,
    backend_order,
    make_backend,
)

__all__ = [
    "BackendChain",
    "CompiledGrammar",
    "GrammarBackend",
    "GrammarMatcher",
    "available_backends",
    "backend_order",
    "make_backend",
]
