"""``voxwire serve`` configured from the environment: every option has a ``VOXWIRE_`` variable, the command line
wins over it, and a bad value is a one-line error naming the variable."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from voxwire.cli import environment
from voxwire.cli.main import build_parser, main
from voxwire.cli.serve import config_from_args

ROOT = Path(__file__).resolve().parents[2]


def serve_parser() -> argparse.ArgumentParser:
    subparsers = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    parser: argparse.ArgumentParser = subparsers.choices["serve"]
    return parser


def parse(*flags: str) -> argparse.Namespace:
    return build_parser().parse_args(["serve", *flags])


def test_variables_set_the_settings() -> None:
    config = config_from_args(
        parse(),
        environ={
            "VOXWIRE_MAX_SESSIONS": "3",
            "VOXWIRE_MAX_CLIP_SECONDS": " 12.5 ",
            "VOXWIRE_MODEL": "sim",
            "VOXWIRE_VOICES_DIR": "/srv/voices",
            "VOXWIRE_BATCH_INVARIANT": "Yes",
            "VOXWIRE_REALTIME": "0",
            "VOXWIRE_ALLOWED_ORIGINS": "https://a.example, https://b.example",
            "VOXWIRE_LORAS": "calm=/loras/calm,,bright=/loras/bright",
            "VOXWIRE_DEVICES": "cpu,cpu",
            "VOXWIRE_KV_CACHE_GB": "0.5",
        },
    )
    assert (config.engine.max_sessions, config.voices.max_clip_seconds, config.engine.model) == (3, 12.5, "sim")
    assert config.voices.voices_dir == Path("/srv/voices")
    assert config.engine.batch_invariant and not config.engine.realtime
    assert config.transport.allowed_origins == ("https://a.example", "https://b.example")
    assert config.personas.loras == (("calm", Path("/loras/calm")), ("bright", Path("/loras/bright")))
    assert config.topology.devices == ("cpu", "cpu")
    assert config.engine.kv_cache_bytes == 2**29


def test_the_command_line_wins_over_the_variable_and_the_variable_over_the_default() -> None:
    environ = {"VOXWIRE_PORT": "9000", "VOXWIRE_REALTIME": "true", "VOXWIRE_BATCH_INVARIANT": "false"}
    # Flags equal to their defaults still win: what was typed is what runs.
    config = config_from_args(parse("--port", "8000", "--no-realtime", "--batch-invariant"), environ=environ)
    assert (config.transport.port, config.engine.realtime, config.engine.batch_invariant) == (8000, False, True)
    config = config_from_args(parse(), environ=environ)
    assert (config.transport.port, config.engine.realtime, config.engine.batch_invariant) == (9000, True, False)
    default = config_from_args(parse(), environ={})
    assert (default.transport.port, default.engine.realtime, default.engine.batch_invariant) == (8000, True, False)
    assert config_from_args(parse(), environ={"VOXWIRE_PORT": " "}).transport.port == 8000  # empty: unset


def test_a_repeatable_option_takes_the_values_of_both() -> None:
    """As $VOXWIRE_API_KEYS always did: keys from the environment stay out of ps output, more may be added."""
    config = config_from_args(parse("--api-key", "a", "--api-key", "b"), environ={"VOXWIRE_API_KEYS": "c, a"})
    assert config.transport.api_keys == ("a", "b", "c")


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("VOXWIRE_MAX_SESSIONS", "many", "VOXWIRE_MAX_SESSIONS: invalid int value: 'many'"),
        ("VOXWIRE_DRAIN_TIMEOUT_S", "30s", "VOXWIRE_DRAIN_TIMEOUT_S: invalid float value: '30s'"),
        ("VOXWIRE_LOG_LEVEL", "LOUD", "VOXWIRE_LOG_LEVEL: invalid choice: 'LOUD' (choose from 'DEBUG', 'INFO',"),
        ("VOXWIRE_BATCH_INVARIANT", "maybe", "VOXWIRE_BATCH_INVARIANT: invalid boolean value: 'maybe'"),
        ("VOXWIRE_REALTIME", "on", "VOXWIRE_REALTIME: invalid boolean value: 'on'"),
        ("VOXWIRE_LORAS", "calm=/x,nameless", "VOXWIRE_LORAS: expected NAME=DIR, got 'nameless'"),
    ],
)
def test_a_bad_value_is_a_one_line_error_naming_the_variable(
    name: str, value: str, message: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(name, value)
    assert main(["serve", "--model", "sim"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"voxwire serve: error: {message}") and err.count("\n") == 1, err


@pytest.mark.slow
def test_the_command_prints_no_traceback_for_a_bad_variable() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "server"), "VOXWIRE_PORT": "http"}
    result = subprocess.run(
        [sys.executable, "-m", "voxwire.cli.main", "serve"], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 2
    assert result.stderr == "voxwire serve: error: VOXWIRE_PORT: invalid int value: 'http'\n"


def test_every_option_reads_its_variable_and_shows_it_in_help() -> None:
    """Walks the parser: an option added to ``serve`` gets its variable with nothing else to write."""
    parser = serve_parser()
    actions = list(environment.options(parser))
    names = [environment.variable(action) for action in actions]
    assert len(names) == len(set(names)) and len(names) == len(parser._actions) - 1  # all but --help
    assert "VOXWIRE_MAX_SESSIONS" in names and "VOXWIRE_API_KEYS" in names and "VOXWIRE_BATCH_INVARIANT" in names
    help_text = " ".join(parser.format_help().split())
    unset = environment.with_environment(parse(), {})
    for action, name in zip(actions, names, strict=True):
        long = next(option for option in action.option_strings if option.startswith("--"))
        assert name == "VOXWIRE_" + long[2:].upper().replace("-", "_") + ("S" if action.default == [] else "")
        assert f"[env: {name}]" in help_text
        value = getattr(environment.with_environment(parse(), {name: _sample(action, unset)}), action.dest)
        assert value != getattr(unset, action.dest), name


def _sample(action: argparse.Action, unset: argparse.Namespace) -> str:
    """A valid value for the option's variable that differs from its default."""
    if action.nargs == 0:
        return "false" if getattr(unset, action.dest) else "true"
    if action.choices:
        return next(str(choice) for choice in action.choices if choice != getattr(unset, action.dest))
    return {int: "12345", float: "0.125"}.get(action.type, "name=/folder")  # type: ignore[arg-type]


@pytest.mark.parametrize("value", ["", " , ", ","])
def test_a_set_but_empty_key_list_is_a_one_line_error(
    value: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A blank ``VOXWIRE_API_KEYS`` (an empty Kubernetes Secret, a template left blank) once started a server with
    authentication off, logging nothing (security probe 4, F7): a list variable that is set must list something."""
    monkeypatch.setenv("VOXWIRE_API_KEYS", value)
    monkeypatch.setattr("voxwire.serving.launch.serve", lambda config: pytest.fail("the server started"))
    assert main(["serve", "--model", "sim"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("voxwire serve: error: VOXWIRE_API_KEYS: set but lists no value") and err.count("\n") == 1
