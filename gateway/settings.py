"""Gateway settings: defaults < config file (TOML or YAML) < environment (CALLPROOF_*) < flags.

One flat dataclass so that every knob has exactly one name, used verbatim as the config-file
key, the flag (``--max-body-bytes``) and the environment variable (``CALLPROOF_MAX_BODY_BYTES``).
docs/configuration.md lists them all.
"""

from __future__ import annotations

import argparse
import difflib
import importlib.util
import math
import os
import re
import sys
import tomllib
import types
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, get_args, get_type_hints
from urllib.parse import urlsplit

from runtime.limits import DEFAULT_LIMITS, Limits
from runtime.renderers import thinks
from runtime.urls import hide_password

ENV_PREFIX = "CALLPROOF_"
# Where the ledger database is: all that `keys`, `ledger` and `export` need of the settings.
DATABASE_SETTINGS = ("data_dir", "db")


class SettingsError(ValueError):
    """A setting has a bad value or the config file cannot be read (exit before serving)."""


@dataclass(frozen=True)
class Settings:
    data_dir: Path = Path("data")
    db: str | None = None  # default: SQLite at <data_dir>/ledger.db
    host: str = "127.0.0.1"
    port: int = 8000
    engine: Literal["embedded", "vllm"] = "embedded"
    model: str | None = None  # embedded: local HF dir or GGUF (default: bundled); vllm: name
    vllm_url: str | None = None
    weights_digest: str | None = None  # vllm: the served weights' sha256, bound in manifests
    vllm_api_key: str | None = field(default=None, repr=False)  # vllm server's --api-key
    vllm_backend: Literal["xgrammar", "guidance"] = "xgrammar"  # the server's, for manifests
    vllm_model_dir: Path | None = None  # vllm: local copy of the served weights, for digests
    vllm_think_budget: int | None = None  # vllm: tokens of free reasoning before the grammar
    vllm_timeout_s: float = 600.0  # vllm: the longest one request may take, stream included
    reasoning: bool | None = None  # thinking model (free <think> region); None: from its name
    signing_key_file: Path | None = None  # default <data_dir>/signing-key.pem, made on first run
    retain_payloads: bool = False  # keep request messages+params in receipts (needed by replay)
    max_body_bytes: int = 1_048_576
    body_timeout_s: float = 30.0  # a request body not all there by then is a 408 (slowloris)
    default_max_tokens: int = 256
    max_tokens_limit: int = 4096
    # limits on constraints (runtime.limits.Limits; same names, same defaults)
    max_tools: int = DEFAULT_LIMITS.max_tools
    max_schema_bytes: int = DEFAULT_LIMITS.max_schema_bytes
    max_schema_depth: int = DEFAULT_LIMITS.max_schema_depth
    max_regex_length: int = DEFAULT_LIMITS.max_regex_length
    max_regex_repeat: int = DEFAULT_LIMITS.max_regex_repeat
    max_regex_loops: int = DEFAULT_LIMITS.max_regex_loops
    max_grammar_bytes: int = DEFAULT_LIMITS.max_grammar_bytes
    max_grammar_depth: int = DEFAULT_LIMITS.max_grammar_depth
    checkpoint_every: int = 1000
    checkpoint_interval_s: float = 60.0
    key_cache_ttl_s: float = 2.0  # how long a looked-up API key is trusted before re-checking
    db_timeout_s: float = 10.0  # a key lookup or receipt commit slower than this fails closed
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = "INFO"

    @property
    def db_url(self) -> str:
        return self.db or f"sqlite:///{(self.data_dir / 'ledger.db').resolve()}"

    @property
    def signing_key_path(self) -> Path:
        return self.signing_key_file or self.data_dir / "signing-key.pem"

    @property
    def limits(self) -> Limits:
        return Limits(**{f.name: getattr(self, f.name) for f in fields(Limits)})


# Bounds beyond "not negative": a port, and sizes and counts where 0 would refuse everything
# (every constraint limit among them: a limit of 0 refuses every request that has one).
_RANGES: dict[str, tuple[float, float]] = {
    "port": (1, 65535),
    "max_body_bytes": (1, math.inf),
    "default_max_tokens": (1, math.inf),
    "max_tokens_limit": (1, math.inf),
    "checkpoint_every": (1, math.inf),
    **{f.name: (1, math.inf) for f in fields(Limits)},
}


def _check_database_url(raw: str) -> None:
    """SQLite or Postgres through psycopg, the drivers callproof ships: any other URL would
    fail later as a missing driver, or as an unavailable database (exit 3, an outage). An
    in-memory SQLite database is gone with its connection: each command found it empty
    (`ledger migrate` said "revision None", `keys create` "no such table")."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    from receipts.ledger_file import sqlite_file

    try:
        url = make_url(raw)
    except ArgumentError:
        url = None
    except ValueError:  # SQLAlchemy's int() of the port: "invalid literal for int()"
        raise ValueError(
            "is not a database URL callproof can use: its port is not a number"
        ) from None
    if url is None or url.drivername not in ("sqlite", "postgresql+psycopg"):
        raise ValueError(
            "is not a database URL callproof can use: sqlite:///PATH or"
            " postgresql+psycopg://USER@HOST/DB"
        )
    if url.drivername == "sqlite" and sqlite_file(raw) is None:
        raise ValueError(
            "is an in-memory SQLite database, gone with each connection: a ledger must be a"
            " file (sqlite:///PATH) or a server (postgresql+psycopg://USER@HOST/DB)"
        )
    if url.drivername == "postgresql+psycopg" and importlib.util.find_spec("psycopg") is None:
        raise ValueError(
            "is a Postgres URL, and callproof's 'postgres' extra (psycopg) is not installed:"
            " pip install 'callproof[postgres]'"
        )


def _check_http_url(raw: str) -> None:
    """The vLLM server's base URL: without a scheme and a host the gateway never gets ready."""
    try:
        parts = urlsplit(raw)
        usable = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != 0
    except ValueError:  # a port that is not a number
        usable = False
    if not usable:
        raise ValueError("must be an http:// or https:// URL with a host, e.g. http://vllm:8000")


def _check_sha256(raw: str) -> None:
    """The weights digest is bound into every manifest as given: a typo there is forever."""
    if not re.fullmatch(r"[0-9a-f]{64}", raw):
        raise ValueError("must be a SHA-256 digest: 64 lowercase hex digits")


# Text settings with a shape of their own; each raises ValueError saying what is expected.
_TEXT_CHECKS: dict[str, Callable[[str], None]] = {
    "db": _check_database_url,
    "vllm_url": _check_http_url,
    "weights_digest": _check_sha256,
}


def _field_names() -> list[str]:
    return [f.name for f in fields(Settings)]


def _coerce(name: str, raw: Any) -> Any:
    """Turn a string (env, flag) or a config-file value into the field's type."""
    if raw is None:  # YAML `port:` or `port: ~`; as an empty variable, not the default
        raise SettingsError(
            f"setting {name!r} is empty in the config file: remove it to get the default"
        )
    kind = get_type_hints(Settings)[name]
    if isinstance(kind, types.UnionType):  # "X | None": coerce to X
        kind = next(a for a in get_args(kind) if a is not type(None))
    try:
        if getattr(kind, "__origin__", None) is Literal:
            return _one_of(name, raw, get_args(kind))
        if kind is bool:
            return _flag(raw)
        if kind in (int, float):
            return _number(name, raw, kind)
        return _text(name, raw, kind)
    except (TypeError, ValueError) as exc:
        raise SettingsError(f"setting {name!r}: {_shown(name, raw)!r} {exc}") from None


def _one_of(name: str, raw: Any, choices: tuple[str, ...]) -> str:
    if name == "log_level" and isinstance(raw, str):
        raw = raw.upper()  # logging's own names, in any case
    if raw not in choices:
        raise ValueError(f"must be one of {', '.join(choices)}")
    return raw


def _flag(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    lowered = str(raw).strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError("must be true or false")


_ZERO_IS_NONE = frozenset({"key_cache_ttl_s"})  # durations whose 0 means "none": no key cache


def _number(name: str, raw: Any, kind: type[int | float]) -> int | float:
    wrong_kind = ValueError(f"must be {'a whole number' if kind is int else 'a number'}")
    if isinstance(raw, bool) or (kind is int and isinstance(raw, float)):
        raise wrong_kind
    try:
        value = kind(raw)
    except (ValueError, TypeError):  # int("8791.7"), int([1]): Python's words, no rule
        raise wrong_kind from None
    if not math.isfinite(value) or value < 0:
        raise ValueError("must be a finite number, not negative")
    if name.endswith("_s") and value == 0 and name not in _ZERO_IS_NONE:
        raise ValueError("must be more than 0 (a duration of 0 fails or disables it)")
    low, high = _RANGES.get(name, (0, math.inf))
    if not low <= value <= high:
        bounds = f"at least {low:g}" if high == math.inf else f"between {low} and {high}"
        raise ValueError(f"must be {bounds}")
    return value


def _text(name: str, raw: Any, kind: Callable[[str], Any]) -> Any:
    if not isinstance(raw, str):  # a config file's `host = 5` is not the host "5"
        raise TypeError("must be a string")
    if raw == "":  # an empty variable must not quietly mean the default (a SQLite db)
        raise ValueError("is empty: unset it to get the default")
    _TEXT_CHECKS.get(name, lambda _: None)(raw)
    return kind(raw)


def _shown(name: str, raw: Any) -> Any:
    """A bad value fit for a message: never the vLLM key, nor a URL's password."""
    if name == "vllm_api_key":
        return "(hidden)"
    if name in ("db", "vllm_url") and isinstance(raw, str):
        return hide_password(raw)
    return raw


def read_config_file(path: Path) -> dict[str, Any]:
    """A flat mapping of setting names (dashes or underscores) from a .toml or .yaml file."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise SettingsError(f"cannot read config file {path}: {exc.strerror}") from None
    if path.suffix not in (".toml", ".yaml", ".yml"):
        raise SettingsError(f"config file {path} must end in .toml, .yaml or .yml")
    import yaml

    try:
        data = tomllib.loads(text) if path.suffix == ".toml" else _load_yaml(text) or {}
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        detail = " ".join(str(exc).split())  # YAML's spans several lines, with the position
        raise SettingsError(f"config file {path} is not valid: {detail}") from None
    if not isinstance(data, dict):
        raise SettingsError(f"config file {path} must hold a mapping of settings")
    settings: dict[str, Any] = {}
    for key, value in data.items():
        name = str(key).replace("-", "_")
        if name in settings:  # `max-tools` and `max_tools`: one setting, given twice
            raise SettingsError(f"config file {path} gives the setting {name!r} twice")
        settings[name] = value
    return settings


def _load_yaml(text: str) -> Any:
    """yaml.safe_load, except that a key given twice in one mapping is an error, as TOML
    has it: PyYAML keeps the last value, so `port: 8000` further down an edited file would
    quietly undo the `port` above it."""
    import yaml

    class UniqueKeys(yaml.SafeLoader):
        def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> Any:
            seen = set()
            for key_node, _ in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag.endswith(":merge"):
                    continue  # a merge (`<<:`) or complex key: PyYAML's rules apply
                key = self.construct_object(key_node)
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"found the key {key!r} a second time", key_node.start_mark
                    )
                seen.add(key)
            return super().construct_mapping(node, deep)

    return yaml.load(text, UniqueKeys)  # a SafeLoader: plain data only


def load_settings(
    flags: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    config_file: Path | None = None,
    only: Collection[str] | None = None,
) -> Settings:
    """Merge the sources; ``flags`` holds only the flags the user actually gave (None = unset).

    ``only``: the settings a command reads (default: all, for `serve`). The others keep their
    defaults, unchecked, so a config file or environment shared with `serve` (its port, its
    vLLM engine) cannot stop `callproof keys`; an unknown key in the file still does."""
    env = os.environ if env is None else env
    names = _field_names()
    merged: dict[str, Any] = {}
    overridden: list[tuple[str, Any]] = []  # values a later source replaces: checked too
    if config_file is None and ENV_PREFIX + "CONFIG" in env:
        if not env[ENV_PREFIX + "CONFIG"]:  # as with any other empty value: not the default
            raise SettingsError(f"{ENV_PREFIX}CONFIG is empty: unset it or name a config file")
        config_file = Path(env[ENV_PREFIX + "CONFIG"])
    if config_file is not None:
        from_file = read_config_file(config_file)
        unknown = sorted(set(from_file) - set(names))
        if unknown:
            raise SettingsError(f"unknown setting(s) in {config_file}: {', '.join(unknown)}")
        merged.update(from_file)
    later = [(n, env[ENV_PREFIX + n.upper()]) for n in names if ENV_PREFIX + n.upper() in env]
    later += [(n, v) for n, v in (flags or {}).items() if v is not None and n in names]
    for name, value in later:  # the environment, then the flags
        if name in merged:
            overridden.append((name, merged[name]))
        merged[name] = value
    used = set(names if only is None else only)
    for name, value in overridden:  # a bad value anywhere stops the start, not only a winner
        if name in used:
            _coerce(name, value)
    settings = Settings(
        **{name: _coerce(name, value) for name, value in merged.items() if name in used}
    )
    _check_combinations(settings, used)
    return settings


def _check_combinations(settings: Settings, used: set[str]) -> None:
    """Settings each fine alone but not together: refused here, before `serve` creates a data
    directory, a ledger or a signing key for a gateway that cannot run; each check only when
    the command reads the settings it involves."""
    if {"default_max_tokens", "max_tokens_limit"} <= used and (
        settings.default_max_tokens > settings.max_tokens_limit
    ):
        raise SettingsError(
            f"setting 'default_max_tokens' ({settings.default_max_tokens}) is above"
            f" 'max_tokens_limit' ({settings.max_tokens_limit}): every request without"
            " max_tokens would be refused"
        )
    if {"engine", "vllm_url", "model"} <= used and (
        settings.engine == "vllm" and not (settings.vllm_url and settings.model)
    ):
        raise SettingsError(
            "--engine vllm needs --vllm-url and --model (the served name), or"
            f" {ENV_PREFIX}VLLM_URL and {ENV_PREFIX}MODEL"
        )
    given = [name for name in _VLLM_ONLY if name in used and getattr(settings, name) is not None]
    if "engine" in used and settings.engine != "vllm" and given:
        raise SettingsError(  # a forgotten CALLPROOF_ENGINE=vllm served the bundled model
            f"setting {given[0]!r} is for --engine vllm, and the engine is"
            f" {settings.engine!r}: set 'engine' to vllm, or unset {given[0]!r}"
        )
    if (
        {"engine", "vllm_backend", "model", "reasoning"} <= used
        and settings.engine == "vllm"
        and settings.vllm_backend == "guidance"
        and thinks(settings.model, settings.reasoning)
    ):  # every constrained request was a 503 after a start that said ready
        raise SettingsError(
            f"model {settings.model!r} is a thinking model (setting 'reasoning'), whose"
            " constraint starts after its reasoning region: vLLM takes that as a structural"
            " tag, which its guidance backend cannot enforce; serve it with the xgrammar"
            " backend and set 'vllm_backend' to xgrammar (or 'reasoning' to false)"
        )
    if (
        {"vllm_url", "vllm_api_key"} <= used
        and settings.vllm_api_key
        and settings.vllm_url
        and urlsplit(settings.vllm_url).password is not None
    ):  # both become the Authorization header: aiohttp refused each request, a 500
        raise SettingsError(
            "setting 'vllm_url' carries a password and 'vllm_api_key' is set: the vLLM"
            " server takes one of them (its --api-key is the API key), remove the other"
        )


# Settings only the vLLM engine reads, unset (None) by default.
_VLLM_ONLY = ("vllm_url", "vllm_api_key", "weights_digest", "vllm_model_dir", "vllm_think_budget")


# CALLPROOF_ variables that are not settings but are read elsewhere (docs/configuration.md).
OTHER_VARIABLES = frozenset({"CONFIG", "SIGNING_KEY", "BACKENDS", "MODEL_CACHE", "PG_BIN"})


def unknown_variables(env: Mapping[str, str]) -> list[str]:
    """CALLPROOF_ variables nothing reads, each with the variable it may have meant: a typo
    in the environment is otherwise silently the default (a config-file typo is an error).
    Names are read in capitals only, so `CALLPROOF_port` is one of them too."""
    known = [name.upper() for name in _field_names()] + sorted(OTHER_VARIABLES)
    found = []
    for variable in sorted(env):
        if not variable.upper().startswith(ENV_PREFIX):
            continue
        name = variable[len(ENV_PREFIX) :]
        if variable.startswith(ENV_PREFIX) and name in known:
            continue
        meant = _meant(name.upper(), known)
        found.append(variable + (f" (did you mean {ENV_PREFIX}{meant}?)" if meant else ""))
    return found


def _meant(name: str, known: list[str]) -> str | None:
    """The known name an unknown one (in capitals) probably meant: itself, when only its case
    was wrong; the longest it extends by ``_...`` (CALLPROOF_DB_URL, an older compose file's
    name, for CALLPROOF_DB: no spelling is close to a name that short); else the closest
    spelling."""
    if name in known:
        return name
    extended = [k for k in known if name.startswith(k + "_")]
    if extended:
        return max(extended, key=len)
    close = difflib.get_close_matches(name, known, n=1)
    return close[0] if close else None


# One line of --help per setting; docs/configuration.md says the rest.
HELP = {
    "data_dir": "where the SQLite ledger and the signing key live",
    "db": "ledger database URL (default: SQLite in the data directory)",
    "host": "listen address",
    "port": "listen port",
    "engine": "embedded (in-process model) or vllm (a vLLM server)",
    "model": "embedded: a model directory or GGUF file; vllm: the served model name",
    "vllm_url": "base URL of the vLLM server",
    "weights_digest": "sha256 of the served weights, bound into every manifest",
    "vllm_api_key": "the vLLM server's --api-key (prefer the environment variable: a flag"
    " shows in ps)",
    "vllm_backend": "the vLLM server's structured-output backend, recorded in manifests",
    "vllm_model_dir": "a local copy of the served weights, for their digests",
    "vllm_think_budget": "tokens of free reasoning before an always-on constraint",
    "vllm_timeout_s": "longest one vLLM request may take, stream included",
    "reasoning": "a thinking model (default: detected from the model name)",
    "signing_key_file": "Ed25519 private key (PEM); only the default file is generated",
    "retain_payloads": "keep each request's messages and parameters in its receipt (replay"
    " needs them)",
    "max_body_bytes": "larger request bodies are a 413",
    "body_timeout_s": "a request body not all received this long after the request began is a 408",
    "default_max_tokens": "max_tokens when a request gives none",
    "max_tokens_limit": "larger max_tokens is a 400",
    "max_tools": "more tools in one request is a 400",
    "max_schema_bytes": "larger schemas are a 400",
    "max_schema_depth": "deeper schemas are a 400",
    "max_regex_length": "longer regexes are a 400",
    "max_regex_repeat": "more copies asked by counted repetitions (regexes and grammars) is a 400",
    "max_regex_loops": "more unbounded repetitions side by side in a regex is a 400",
    "max_grammar_bytes": "larger grammars are a 400",
    "max_grammar_depth": "grammars whose rule references nest deeper are a 400",
    "checkpoint_every": "sign a checkpoint every N receipts of a chain",
    "checkpoint_interval_s": "... or every T seconds when a chain has unsigned receipts",
    "key_cache_ttl_s": "how long a looked-up API key is trusted before it is checked again"
    " (0: no cache, a revoked key stops at once)",
    "db_timeout_s": "longest wait on the database before failing closed with a 503",
    "log_level": "JSON log level",
}


def add_arguments(parser: argparse.ArgumentParser, only: tuple[str, ...] | None = None) -> None:
    """One `--flag` per setting (or the `only` ones), plus `--config FILE`; defaults stay unset
    so that the environment and the config file are not overridden by a flag nobody gave."""
    parser.add_argument("--config", type=Path, help="settings file (.toml or .yaml)")
    hints = get_type_hints(Settings)
    for f in fields(Settings):
        if only is not None and f.name not in only:
            continue
        flag = "--" + f.name.replace("_", "-")
        helped = f"{HELP[f.name]} (env {ENV_PREFIX}{f.name.upper()})"
        hint = hints[f.name]
        if hint in (bool, bool | None):
            parser.add_argument(
                flag, action=argparse.BooleanOptionalAction, default=None, help=helped
            )
        elif getattr(hint, "__origin__", None) is Literal:  # checked by _coerce, as env is
            choices = "{" + ",".join(get_args(hint)) + "}"
            parser.add_argument(flag, default=None, metavar=choices, help=helped)
        else:
            parser.add_argument(flag, default=None, metavar=f.name.upper(), help=helped)


def settings_from_args(args: argparse.Namespace, only: Collection[str] | None = None) -> Settings:
    """The settings of a command given `add_arguments`' flags (``only``: those it reads, as
    for `load_settings`). Every command that reads settings comes through here, so each names
    the CALLPROOF_ variables nothing reads, first (a typo may be why settings fail, or why a
    new ./data appears instead of the real one)."""
    for variable in unknown_variables(os.environ):
        print(f"callproof: ignoring {variable}", file=sys.stderr)
    flags = {name: getattr(args, name) for name in _field_names() if hasattr(args, name)}
    return load_settings(flags, config_file=args.config, only=only)
