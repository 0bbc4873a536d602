"""Typed errors raised by runtime/.

Every input error names the request parameter at fault (``param``) and a stable ``code`` so
the gateway can turn it into an OpenAI-shaped 4xx without guessing. Faults of the decoding
runtime itself (engine unreachable) are a separate family: the gateway fails closed on them.
"""

from __future__ import annotations

from typing import Any


class RuntimeInputError(ValueError):
    """The request cannot be served as given; fixing the request fixes the error. HTTP 400
    unless a subclass says otherwise (StructuredOutputInvalid: 422)."""

    code: str = "invalid_value"  # the generic code docs/api.md lists for a 400
    status: int = 400

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code


class ConflictingConstraints(RuntimeInputError):
    code = "conflicting_constraints"


class InvalidTools(RuntimeInputError):
    code = "invalid_tools"


class UnknownTool(RuntimeInputError):
    code = "unknown_tool"


class InvalidSchema(RuntimeInputError):
    code = "invalid_schema"


class InvalidRegex(RuntimeInputError):
    code = "invalid_regex"


class InvalidGrammar(RuntimeInputError):
    code = "invalid_grammar"


class ConstraintTooComplex(RuntimeInputError):
    """Over a configured limit: schema size or depth, tool count, regex complexity."""

    code = "constraint_too_complex"


class BackendCannotCompile(RuntimeInputError):
    """A grammar backend lacks a feature this (valid) constraint needs. The backend chain
    falls through to the next backend; raised to the caller only when none can compile it,
    which is when the engine may use the post-hoc retry path instead."""

    code = "constraint_unsupported"


class ConstraintUnsatisfiable(RuntimeInputError):
    """The constraint admits no output at all (an empty enum, a minLength over its maxLength,
    a special token the model cannot write): no backend and no retry could satisfy it."""

    code = "constraint_unsatisfiable"


class UnsupportedParameter(RuntimeInputError):
    code = "unsupported_parameter"


class StructuredOutputInvalid(RuntimeInputError):
    """Model output fails its constraint (HTTP 422). ``param`` names the request field whose
    constraint it fails (tools, response_format, regex; max_tokens or stop when one of them
    cut it short), so each raise site says which: there is no default to be wrong."""

    code = "structured_output_invalid"
    status = 422

    def __init__(
        self,
        message: str,
        *,
        schema: Any,
        raw_output: str | None,
        pointer: str,
        param: str,
    ):
        super().__init__(message, param=param)
        self.schema = schema
        self.raw_output = raw_output
        self.pointer = pointer


class OutputLeftGrammar(StructuredOutputInvalid):
    """Output that left its grammar, where a reading of it is possible (runtime.grammar_check):
    a 422 even when max_tokens or a stop string cut it, since no more text could have made
    it the grammar's (other output cut short is returned as far as it went)."""


class EngineError(RuntimeError):
    """The decoding runtime failed or cannot start; each subclass carries the HTTP status and
    error code the gateway answers with (503 unless it says otherwise)."""

    status: int = 503
    code: str = "engine_unavailable"


class EngineUnavailable(EngineError):
    """The engine is not loaded, unreachable, or timed out."""


class EngineConfigError(EngineError):
    """The engine cannot start as configured (an unknown or missing grammar backend, a model
    path that is no model); raised at startup, with the setting to change."""

    code = "engine_misconfigured"


class EngineFault(EngineError):
    """The engine broke its own contract (a backend let through a token its mask forbade, a
    stream ended without its result): a bug to report, not a passing fault. The request
    fails closed and nothing is recorded (HTTP 500)."""

    status = 500
    code = "engine_fault"


class EngineRejected(EngineError):
    """The upstream engine refused the request with a 4xx; carries its status and message."""

    code = "upstream_rejected"

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message
