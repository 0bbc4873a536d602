"""Settings precedence (defaults < config file < environment < flags) and refusals."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from gateway.settings import SettingsError, load_settings, unknown_variables


def test_precedence_file_env_flags(tmp_path: Path) -> None:
    config = tmp_path / "callproof.toml"
    config.write_text('port = 9000\nhost = "0.0.0.0"\nretain-payloads = true\nmax_tools = 8\n')
    env = {"CALLPROOF_PORT": "9100", "CALLPROOF_DATA_DIR": str(tmp_path / "d")}
    settings = load_settings({"port": "9200", "host": None}, env, config)
    assert settings.port == 9200  # flag over env over file
    assert settings.host == "0.0.0.0"  # an unset flag does not override the file
    assert settings.retain_payloads is True
    assert settings.limits.max_tools == 8
    assert settings.db_url == f"sqlite:///{(tmp_path / 'd' / 'ledger.db').resolve()}"
    assert settings.signing_key_path == tmp_path / "d" / "signing-key.pem"


def test_yaml_file_named_by_the_environment(tmp_path: Path) -> None:
    config = tmp_path / "gw.yaml"
    config.write_text("engine: vllm\nvllm_url: http://127.0.0.1:8001\nmodel: served\n")
    settings = load_settings({}, {"CALLPROOF_CONFIG": str(config)})
    assert (settings.engine, settings.vllm_url, settings.model) == (
        "vllm",
        "http://127.0.0.1:8001",
        "served",
    )


@pytest.mark.parametrize(
    ("flags", "env", "message"),
    [
        ({"engine": "tpu"}, {}, "must be one of embedded, vllm"),
        ({"port": "-1"}, {}, "not negative"),
        ({"port": "8791.7"}, {}, "'port': '8791.7' must be a whole number$"),
        ({}, {"CALLPROOF_DB_TIMEOUT_S": "soon"}, "'db_timeout_s': 'soon' must be a number$"),
        ({"db_timeout_s": "0"}, {}, "must be more than 0"),
        ({}, {"CALLPROOF_VLLM_TIMEOUT_S": "nan"}, "must be a finite number"),
        ({}, {"CALLPROOF_RETAIN_PAYLOADS": "maybe"}, "must be true or false"),
        ({}, {"CALLPROOF_MAX_BODY_BYTES": "lots"}, "max_body_bytes"),
        ({}, {"CALLPROOF_DB": ""}, "'db': '' is empty"),  # not a quiet SQLite ledger
        ({}, {"CALLPROOF_CONFIG": ""}, "CALLPROOF_CONFIG is empty"),  # was silently ignored
        ({"port": "70000"}, {}, "between 1 and 65535"),
        ({"max_body_bytes": "0"}, {}, "'max_body_bytes': '0' must be at least 1$"),
        ({"max_tools": "0"}, {}, "'max_tools': '0' must be at least 1"),  # refuses every tool
        ({}, {"CALLPROOF_MAX_GRAMMAR_DEPTH": "0"}, "'max_grammar_depth'"),
        ({"checkpoint_interval_s": "0"}, {}, "'checkpoint_interval_s': '0' must be more than 0"),
        ({"default_max_tokens": "5000", "max_tokens_limit": "100"}, {}, "above 'max_tokens_limit'"),
        ({"db": "notaurl"}, {}, "'db': 'notaurl' is not a database URL callproof can use"),
        ({"db": "mysql://u:pw@h/x"}, {}, r"'db': 'mysql://u:\*\*\*@h/x' is not a database URL"),
        ({"vllm_url": "127.0.0.1:18801"}, {}, "'vllm_url': .* must be an http:// or https://"),
        ({"vllm_url": "ftp://x"}, {}, "'vllm_url': 'ftp://x' must be an http"),
        ({"vllm_url": "ftp://u:pw@x"}, {}, r"'vllm_url': 'ftp://u:\*\*\*@x' must be an http"),
        ({"vllm_url": "http://:8000"}, {}, "with a host"),
        (  # both are the Authorization header: every request was a 500 from aiohttp
            {"engine": "vllm", "model": "m", "vllm_url": "http://u:pw@vllm:8000"},
            {"CALLPROOF_VLLM_API_KEY": "k"},
            "'vllm_url' carries a password and 'vllm_api_key' is set",
        ),
        (  # vLLM's guidance backend cannot enforce a constraint after a reasoning region:
            # every constrained request was a 503, after a start that said ready
            {"engine": "vllm", "vllm_url": "http://v:8000", "model": "Qwen/Qwen3-8B"},
            {"CALLPROOF_VLLM_BACKEND": "guidance"},
            "'Qwen/Qwen3-8B' is a thinking model .* set 'vllm_backend' to xgrammar",
        ),
        (
            {"engine": "vllm", "vllm_url": "http://v:8000", "model": "m", "reasoning": "true"},
            {"CALLPROOF_VLLM_BACKEND": "guidance"},
            "is a thinking model",
        ),
        (  # a forgotten CALLPROOF_ENGINE=vllm: the bundled model answered, without a word
            {},
            {"CALLPROOF_VLLM_URL": "http://vllm:8000"},
            "'vllm_url' is for --engine vllm, and the engine is 'embedded'",
        ),
        ({"vllm_think_budget": "64"}, {}, "'vllm_think_budget' is for --engine vllm"),
        ({"db": "postgresql+psycopg://u@h:notaport/d"}, {}, "'db': .* port is not a number$"),
        # each command found an empty database: `ledger migrate` exit 0 at "revision None"
        ({"db": "sqlite://"}, {}, "'db': 'sqlite://' is an in-memory SQLite database"),
        ({"db": "sqlite:///:memory:"}, {}, "in-memory .* must be a file .* or a server"),
        ({}, {"CALLPROOF_DB": "sqlite:///file:x?mode=memory&uri=true"}, "in-memory"),
        ({"weights_digest": "nothex"}, {}, "must be a SHA-256 digest: 64 lowercase hex"),
        ({"weights_digest": "AB" * 32}, {}, "64 lowercase hex"),
    ],
)
def test_bad_values_are_named(flags: dict, env: dict, message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        load_settings(flags, env)


def test_guidance_serves_a_model_that_does_not_think() -> None:
    vllm = {"engine": "vllm", "vllm_url": "http://v:8000", "vllm_backend": "guidance"}
    for flags in ({"model": "Qwen/Qwen3-8B", "reasoning": "false"}, {"model": "SmolLM2"}):
        assert load_settings({**vllm, **flags}, {}).vllm_backend == "guidance"


def test_a_key_cache_ttl_of_zero_turns_the_cache_off() -> None:
    """The one duration whose 0 means something: no cache (every other 0 fails or hangs)."""
    assert load_settings({"key_cache_ttl_s": "0"}, {}).key_cache_ttl_s == 0


def test_a_bad_value_is_refused_even_where_another_source_overrides_it(tmp_path: Path) -> None:
    """A bad value anywhere stops the start (docs/configuration.md): one in the file that the
    environment or a flag overrides was never read, and waited for the day it was not."""
    config = tmp_path / "c.toml"
    config.write_text("port = 0\n")
    with pytest.raises(SettingsError, match="'port': 0"):
        load_settings({}, {"CALLPROOF_PORT": "18110"}, config)
    with pytest.raises(SettingsError, match="'port': 'x'"):
        load_settings({"port": "18110"}, {"CALLPROOF_PORT": "x"})
    assert load_settings({"port": "18111"}, {"CALLPROOF_PORT": "18110"}).port == 18111


def test_a_config_file_number_of_the_wrong_kind_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text("port = 8791.7\n")  # was truncated to 8791
    with pytest.raises(SettingsError, match="'port': 8791.7 must be a whole number"):
        load_settings({}, {}, config)
    config.write_text("checkpoint_every = true\n")
    with pytest.raises(SettingsError, match="whole number"):
        load_settings({}, {}, config)
    config.write_text("port = [1]\n")  # Python's int() message, naming no rule
    with pytest.raises(SettingsError, match=r"'port': \[1\] must be a whole number$"):
        load_settings({}, {}, config)
    config.write_text("db_timeout_s = {a = 1}\n")
    with pytest.raises(SettingsError, match="must be a number$"):
        load_settings({}, {}, config)
    config.write_text("host = 5\n")  # was the host "5"
    with pytest.raises(SettingsError, match="'host': 5 must be a string"):
        load_settings({}, {}, config)
    config.write_text("db = 5\n")  # was the database URL "5"
    with pytest.raises(SettingsError, match="'db': 5 must be a string"):
        load_settings({}, {}, config)


@pytest.mark.parametrize("setting", ["port", "max_tools", "db_timeout_s", "db", "data_dir"])
def test_an_empty_yaml_value_is_refused_not_unset(tmp_path: Path, setting: str) -> None:
    """`key:` and `key: ~` read as null: it once reached the gateway as None (a traceback, a
    500 on every request with tools, or no database deadline at all)."""
    config = tmp_path / "c.yaml"
    for text in (f"{setting}:\n", f"{setting}: ~\n"):
        config.write_text(text)
        with pytest.raises(SettingsError, match=f"'{setting}' is empty in the config file"):
            load_settings({}, {}, config)


def test_database_and_vllm_urls_callproof_can_use_are_taken() -> None:
    for url in ("sqlite:////tmp/x.db", "postgresql+psycopg://u:pw@db.internal:5432/callproof"):
        assert load_settings({"db": url}, {}).db_url == url
    vllm = {"engine": "vllm", "model": "m"}
    url = "https://vllm:8000/v1"
    assert load_settings({**vllm, "vllm_url": url}, {}).vllm_url == url
    digest = load_settings({**vllm, "vllm_url": url, "weights_digest": "ab" * 32}, {})
    assert digest.weights_digest == "ab" * 32


def test_unknown_variables_are_named_with_the_setting_meant() -> None:
    env = {
        "CALLPROOF_RETAIN_PAYLOAD": "1",
        "CALLPROOF_PORT": "1",
        "CALLPROOF_SIGNING_KEY": "pem",
        "CALLPROOF_ZZZ": "x",
        "HOME": "/root",
    }
    assert unknown_variables(env) == [
        "CALLPROOF_RETAIN_PAYLOAD (did you mean CALLPROOF_RETAIN_PAYLOADS?)",
        "CALLPROOF_ZZZ",
    ]


def test_a_variable_that_extends_a_known_name_is_named_with_it() -> None:
    """CALLPROOF_DB_URL (an older compose file's name) was 'ignoring CALLPROOF_DB_URL' with no
    hint, and `ledger migrate` made a SQLite ledger in the data directory instead; a known
    name followed by `_...` is the one meant (the longest, and not only settings')."""
    env = dict.fromkeys(
        ["CALLPROOF_DB_URL", "CALLPROOF_VLLM_URL_X", "CALLPROOF_DB_TIMEOUT_S_MAX",
         "CALLPROOF_SIGNING_KEY_PEM"],
        "x",
    )  # fmt: skip
    assert unknown_variables(env) == [
        "CALLPROOF_DB_TIMEOUT_S_MAX (did you mean CALLPROOF_DB_TIMEOUT_S?)",
        "CALLPROOF_DB_URL (did you mean CALLPROOF_DB?)",
        "CALLPROOF_SIGNING_KEY_PEM (did you mean CALLPROOF_SIGNING_KEY?)",
        "CALLPROOF_VLLM_URL_X (did you mean CALLPROOF_VLLM_URL?)",
    ]


def test_a_variable_in_the_wrong_case_is_named_not_silently_unread() -> None:
    """The settings read CALLPROOF_PORT only; `CALLPROOF_port` counted as known (its name
    matched a setting's in lower case) and the port stayed the default without a word."""
    env = dict.fromkeys(["CALLPROOF_port", "callproof_db", "CALLPROOF_Model_Cache"], "x")
    assert unknown_variables(env) == [
        "CALLPROOF_Model_Cache (did you mean CALLPROOF_MODEL_CACHE?)",
        "CALLPROOF_port (did you mean CALLPROOF_PORT?)",
        "callproof_db (did you mean CALLPROOF_DB?)",
    ]


def test_log_level_takes_logging_names_in_any_case() -> None:
    assert load_settings({"log_level": "info"}, {}).log_level == "INFO"


@pytest.mark.parametrize(
    ("name", "text"), [("c.yaml", "port: [1\n"), ("c.toml", "port = 1 2\n"), ("c.yml", "a: b: c")]
)
def test_a_config_file_that_does_not_parse_is_named(tmp_path: Path, name: str, text: str) -> None:
    config = tmp_path / name
    config.write_text(text)
    with pytest.raises(SettingsError, match=f"config file {config} is not valid: .*line 1"):
        load_settings({}, {}, config)


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("c.yaml", "port: 9000\nhost: 0.0.0.0\nport: 8000\n", "found the key 'port' a second time"),
        ("c.yml", "max-tools: 8\nmax_tools: 9\n", "gives the setting 'max_tools' twice"),
        ("c.toml", "max-tools = 8\nmax_tools = 9\n", "gives the setting 'max_tools' twice"),
    ],
)
def test_a_setting_given_twice_in_a_config_file_is_refused(
    tmp_path: Path, name: str, text: str, message: str
) -> None:
    """PyYAML keeps a key's last value, so a `port` further down an edited file quietly
    undid the one above it (TOML refuses a key twice); and `max-tools` beside `max_tools`
    in either format did the same after dashes became underscores."""
    config = tmp_path / name
    config.write_text(text)
    with pytest.raises(SettingsError, match=f"config file {config} .*{message}"):
        load_settings({}, {}, config)


def test_unknown_keys_and_unreadable_files_are_refused(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text("prot = 1\n")
    with pytest.raises(SettingsError, match="unknown setting.*prot"):
        load_settings({}, {}, config)
    with pytest.raises(SettingsError, match="cannot read"):
        load_settings({}, {}, tmp_path / "missing.toml")
    (tmp_path / "c.ini").write_text("x")
    with pytest.raises(SettingsError, match=r"\.toml, \.yaml"):
        load_settings({}, {}, tmp_path / "c.ini")


def test_a_command_that_reads_only_the_database_checks_only_the_database(tmp_path: Path) -> None:
    """A config file and environment shared with `serve` (engine vllm, its URL and model in
    serve's environment only; a port keys never opens) stopped `callproof keys` with
    '--engine vllm needs --vllm-url', flags keys does not have. Unknown keys in the file,
    and bad values of the settings read, are still refused."""
    from gateway.settings import DATABASE_SETTINGS

    config = tmp_path / "c.yaml"
    config.write_text(f"engine: vllm\ndata_dir: {tmp_path / 'd'}\n")
    env = {"CALLPROOF_PORT": "http", "CALLPROOF_DEFAULT_MAX_TOKENS": "9999"}
    settings = load_settings({}, env, config, only=DATABASE_SETTINGS)
    assert settings.db_url == f"sqlite:///{(tmp_path / 'd' / 'ledger.db').resolve()}"
    assert settings.port == 8000 and settings.engine == "embedded"  # defaults: not read
    with pytest.raises(SettingsError, match="needs --vllm-url"):
        load_settings({}, {}, config)  # serve reads them all
    with pytest.raises(SettingsError, match="'db': 'notaurl'"):
        load_settings({}, {"CALLPROOF_DB": "notaurl"}, config, only=DATABASE_SETTINGS)
    config.write_text("engine: vllm\nprot: 1\n")
    with pytest.raises(SettingsError, match="unknown setting.*prot"):
        load_settings({}, {}, config, only=DATABASE_SETTINGS)


def test_vllm_engine_gets_every_vllm_setting(tmp_path: Path) -> None:
    from gateway.boot import load_engine
    from runtime.model_store import bundled_model_dir, model_digests

    model_dir = bundled_model_dir()
    env = {
        "CALLPROOF_ENGINE": "vllm",
        "CALLPROOF_VLLM_URL": "http://127.0.0.1:9",
        "CALLPROOF_MODEL": "served",
        "CALLPROOF_VLLM_API_KEY": "sk-upstream-secret",
        "CALLPROOF_VLLM_BACKEND": "guidance",
        "CALLPROOF_VLLM_MODEL_DIR": str(model_dir),
        "CALLPROOF_VLLM_THINK_BUDGET": "64",
    }
    settings = load_settings({}, env)
    assert "sk-upstream-secret" not in repr(settings)
    engine = load_engine(settings)
    digests = model_digests(model_dir)
    assert (engine.identity.model, engine.identity.backend) == ("served", "guidance")
    assert (engine.identity.weights_digest, engine.identity.tokenizer_digest) == (
        digests.weights,
        digests.tokenizer,
    )
    assert engine.think_budget == 64


@pytest.mark.model
def test_a_raised_constraint_limit_reaches_the_embedded_engine() -> None:
    """The engine re-checks every constraint it compiles: with the defaults it would refuse
    what the operator allowed, quoting a limit nobody configured."""
    import asyncio

    from gateway.boot import load_engine
    from runtime.constraint import Constraint
    from runtime.limits import DEFAULT_LIMITS

    pattern = "(" + "|".join(f"w{n:04d}" for n in range(400)) + ")"  # 2,400 characters
    assert DEFAULT_LIMITS.max_regex_length < len(pattern) < 4096
    engine = load_engine(load_settings({}, {"CALLPROOF_MAX_REGEX_LENGTH": "4096"}))
    try:
        assert engine.grammars.get(Constraint.regex(pattern), timeout=60) is not None
    finally:
        asyncio.run(engine.aclose())


def test_every_setting_has_a_flag_with_help() -> None:
    """`serve --help` says what each flag does; a boolean that may be unset is --x/--no-x."""
    import argparse

    from gateway.settings import HELP, Settings, add_arguments, settings_from_args

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    flags = {a.dest: a for a in parser._actions}
    assert set(HELP) == {f.name for f in dataclasses.fields(Settings)}
    assert all(flags[name].help.startswith(HELP[name]) for name in HELP)
    assert settings_from_args(parser.parse_args(["--no-reasoning"])).reasoning is False
    assert settings_from_args(parser.parse_args(["--log-level", "debug"])).log_level == "DEBUG"
    with pytest.raises(SettingsError, match="must be one of embedded, vllm"):
        settings_from_args(parser.parse_args(["--engine", "gpu"]))
