"""`callproof generate` end to end: the console command on the real bundled model, and its
errors for bad input (which must come before any model is loaded)."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from callproof.commands import generate as generate_command

pytestmark = pytest.mark.model

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "minLength": 1, "maxLength": 30},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": WEATHER,
            "description": "Current weather for a city",
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "Time in a city",
            "parameters": {"type": "object", "properties": {}},
        },
    },
]


@pytest.fixture
def tools_file(tmp_path: Path) -> Path:
    path = tmp_path / "tools.json"
    path.write_text(json.dumps(TOOLS))
    return path


def cli(*argv: str) -> int:
    """The generate sub-command in-process, parsed exactly as the console script parses it."""
    parser = argparse.ArgumentParser(prog="callproof")
    generate_command.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["generate", *argv])
    return args.handler(args)


def test_named_tool_choice_prints_one_json_object_with_that_call(tools_file: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "callproof",
            "generate",
            "--tools",
            str(tools_file),
            "--tool-choice",
            "get_weather",
            "--max-tokens",
            "48",
            "--json",
            "Should I take an umbrella in Amsterdam?",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1
    out = json.loads(lines[0])
    assert {"text", "answer", "parsed", "tool_calls", "backend", "finish_reason"} <= out.keys()
    (call,) = out["tool_calls"]
    assert call["name"] == "get_weather"
    assert re.fullmatch(r"call_[0-9a-f]{24}", call["id"])
    jsonschema.validate(call["arguments"], WEATHER)
    assert out["answer"] is None and out["finish_reason"] == "stop"
    assert out["backend"] != "none"


def test_schema_output_is_parsed(tmp_path: Path, capsys) -> None:
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    }
    (tmp_path / "schema.json").write_text(json.dumps(schema))
    code = cli(
        "--schema",
        str(tmp_path / "schema.json"),
        "--json",
        "--max-tokens",
        "16",
        "Is the sky blue?",
    )
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["parsed"] in ({"ok": True}, {"ok": False})
    assert out["tool_calls"] == [] and out["text"] == json.dumps(
        out["parsed"], separators=(",", ":")
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--tools", "{dir}/missing.json", "x"], "cannot read"),
        (["--tools", "{dir}/not-json.json", "x"], "is not valid JSON"),
        (["--tools", "{dir}/tools.json", "--tool-choice", "nosuch", "x"], "'nosuch'"),
        (["--tool-choice", "auto", "x"], "--tool-choice needs --tools"),
        (["--regex", "a(", "x"], "does not compile"),
        (["--grammar", "{dir}/not-json.json", "x"], "invalid grammar"),
    ],
)
def test_bad_input_is_a_clear_error(
    tmp_path: Path, tools_file: Path, capsys, argv: list[str], message: str
) -> None:
    (tmp_path / "not-json.json").write_text("{nope")
    code = cli(*[a.format(dir=tmp_path) for a in argv])
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("callproof generate: ") and message in err


def test_constraint_flags_are_mutually_exclusive(tools_file: Path, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        cli("--regex", "a", "--tools", str(tools_file), "x")
    assert info.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err
