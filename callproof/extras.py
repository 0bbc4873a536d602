"""Which of callproof's optional parts this installation has.

`pip install callproof` is the offline verifier alone (what an auditor needs for `callproof
verify`); the gateway, Postgres and the embedded engine are extras (pyproject.toml). A command
whose extra is missing says which one to install instead of failing on an import deep inside.
The answer comes from the installed distributions' metadata, so it cannot drift from
pyproject.toml.
"""

from __future__ import annotations

import functools
import importlib.metadata
import re

DISTRIBUTION = "callproof"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_EXTRAS_OF_SELF = re.compile(r"\[([^\]]*)\]")
_ONLY_EXTRA = re.compile(r"""^extra\s*==\s*["']([^"']+)["']$""")


class MissingExtra(ImportError):
    """A command or setting needs an optional part of callproof that is not installed."""

    def __init__(self, extra: str, missing: list[str], what: str) -> None:
        super().__init__(
            f"{what} needs callproof's {extra!r} extra, which is not installed"
            f" (missing: {', '.join(missing)}): pip install 'callproof[{extra}]'"
        )


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@functools.cache
def missing(extra: str) -> tuple[str, ...]:
    """The distributions ``extra`` asks for that are not installed, in pyproject's order (an
    extra that names another, as embedded names gateway, includes its list). A requirement
    with an environment marker besides its extra (uvloop: not on Windows) is not checked."""
    try:
        requirements = importlib.metadata.requires(DISTRIBUTION) or []
    except importlib.metadata.PackageNotFoundError:  # run from a source tree never installed:
        return ()  # nothing to go by, so imports will say what is missing
    absent: list[str] = []
    for requirement in requirements:
        spec, _, marker = requirement.partition(";")
        wanted = _ONLY_EXTRA.match(marker.strip())
        if wanted is None or wanted.group(1) != extra:
            continue
        name = _NAME.match(spec.strip())
        assert name is not None, requirement  # pip wrote this metadata from pyproject.toml
        if _normalized(name.group()) == DISTRIBUTION:
            inner = _EXTRAS_OF_SELF.search(spec)
            for other in inner.group(1).split(",") if inner else ():
                absent.extend(n for n in missing(other.strip()) if n not in absent)
            continue
        try:
            importlib.metadata.distribution(name.group())
        except importlib.metadata.PackageNotFoundError:
            absent.append(name.group())
    return tuple(absent)


def require(extra: str, what: str) -> None:
    """Raise MissingExtra naming ``what`` when ``extra`` is not installed."""
    absent = missing(extra)
    if absent:
        raise MissingExtra(extra, list(absent), what)
