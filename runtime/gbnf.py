"""GBNF, llama.cpp's grammar dialect (``root ::= ...``), read as the Lark that llguidance
compiles: clients send either, and every backend but xgrammar (whose own EBNF is GBNF) is
handed Lark. The conversion is llguidance's, with its escapes of code points fixed first.
"""

from __future__ import annotations

import re


def is_gbnf(grammar: str) -> bool:
    """llama.cpp GBNF (``root ::= ...``) rather than Lark (``start: ...``)."""
    from llguidance.gbnf_to_lark import is_lark_syntax

    return not is_lark_syntax(grammar)


def to_lark(grammar: str) -> str:
    """The grammar in Lark syntax: GBNF (``::=`` rules) is converted, Lark passes through."""
    from llguidance.gbnf_to_lark import GbnfToLarkError, gbnf_to_lark

    if not is_gbnf(grammar):
        return grammar
    try:
        return gbnf_to_lark(_GBNF_UNICODE_ESCAPE.sub(_kept_escape, grammar))
    except GbnfToLarkError as exc:
        raise ValueError(f"cannot read the GBNF grammar: {exc}") from None
    except RecursionError:  # the converter recurses once per nested group
        raise ValueError(
            "cannot convert the GBNF grammar: its groups nest deeper than the converter"
            " follows; name the inner parts as rules"
        ) from None
    # The converter raises a bare Exception for a missing or unknown rule.
    except Exception as exc:  # noqa: BLE001
        raise ValueError(f"cannot convert the GBNF grammar: {exc}") from None


# A GBNF escape pair, the \uXXXX and \UXXXXXXXX ones captured (others are left as written).
_GBNF_UNICODE_ESCAPE = re.compile(r"\\(?:u([0-9a-fA-F]{4})|U([0-9a-fA-F]{8})|.)", re.DOTALL)


def _kept_escape(escape: re.Match[str]) -> str:
    """A GBNF \\u or \\U escape as llguidance's converter passes it on intact: it drops the
    leading zeros of these (\\u00e9 became \\ue9, which Lark refuses or reads as another
    character). Below U+0100 the \\xHH escape, which the converter keeps and Lark and its
    regexes read, so a quote, backslash, bracket, dash, caret or control stays escaped where
    it stands; above, the character itself, which is special nowhere."""
    digits = escape.group(1) or escape.group(2)
    if digits is None:
        return escape.group()
    code = int(digits, 16)
    if code < 0x100:
        return f"\\x{code:02x}"
    if 0xD800 <= code <= 0xDFFF or code > 0x10FFFF:
        raise ValueError(
            f"{escape.group()} is not a character (a UTF-16 surrogate, or past U+10FFFF):"
            " write a character outside the BMP as \\U and eight hex digits"
        )
    return chr(code)


__all__ = ["is_gbnf", "to_lark"]
