"""``ServerConfig`` in groups: a setting has one group and one name, found from its flat name, and its docstring
is the help ``voxwire serve --help`` shows."""

from __future__ import annotations

import argparse
import dataclasses
from typing import ClassVar, Literal

import pytest

from voxwire.cli.main import build_parser
from voxwire.serving.server_config import Limits, ServerConfig, Topology
from voxwire.serving.settings import groups, plain


@dataclasses.dataclass(frozen=True)
class Pace:
    title: ClassVar[str] = "Pace"

    pace: Literal["fast", "slow"] = "fast"
    """How fast (a Literal: no class a flag's text can be made into)."""


@dataclasses.dataclass(frozen=True)
class PacedConfig:
    pace: Pace = dataclasses.field(default_factory=Pace)


def serve_help() -> str:
    subparsers = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return " ".join(subparsers.choices["serve"].format_help().split())


def test_flat_names_find_their_groups_and_the_rest_defaults() -> None:
    config = ServerConfig.of(max_connections=3, workers=0, max_sessions=2, port=0)
    assert (config.limits.max_connections, config.topology.workers, config.engine.max_sessions) == (3, 0, 2)
    assert config.transport.port == 0
    assert config.audio == ServerConfig().audio and config.voices == ServerConfig().voices


def test_with_settings_replaces_only_the_named_settings() -> None:
    config = ServerConfig.of(port=0, max_sessions=2)
    moved = config.with_settings(port=9000)
    assert (moved.transport.port, moved.engine.max_sessions) == (9000, 2)
    assert moved.engine is config.engine  # untouched groups are shared, not rebuilt
    assert config.transport.port == 0


def test_an_unknown_setting_is_refused() -> None:
    with pytest.raises(TypeError, match="no setting 'max_session'"):
        ServerConfig.of(max_session=2)


def test_a_bad_value_is_refused_by_its_group_naming_the_setting() -> None:
    with pytest.raises(ValueError, match=r"Limits\.max_connections=0 is invalid"):
        ServerConfig.of(max_connections=0)
    with pytest.raises(ValueError, match="devices="):  # a rule across groups: --device excludes --devices
        ServerConfig.of(device="cpu", devices=("cpu",))
    # Under the default timesteps every request naming none (and the warm-up: the server never got ready) failed.
    with pytest.raises(ValueError, match=r"max_inference_timesteps=9 is invalid: must be >= 10, the default"):
        ServerConfig.of(max_inference_timesteps=9)


def test_workers_is_topology_not_a_limit() -> None:
    assert "workers" in {f.name for f in dataclasses.fields(Topology)}
    assert "workers" not in {f.name for f in dataclasses.fields(Limits)}


def test_names_and_flags_are_unique_across_groups() -> None:
    settings = [setting for group in groups(ServerConfig) for setting in group.settings]
    assert len({s.name for s in settings}) == len({s.option for s in settings}) == len(settings)


def test_every_flag_shows_its_docstring_as_its_help() -> None:
    help_text = serve_help()
    unwrapped = "".join(help_text.split())  # argparse wraps lines, also after a hyphen (--no-\nrealtime)
    for group in groups(ServerConfig):
        assert group.title + ":" in help_text
        for setting in group.settings:
            assert setting.doc and "".join(plain(setting.doc).split()) in unwrapped, setting.name


def test_a_rule_default_is_shown_once() -> None:
    help_text = serve_help()
    assert "(default: the hostname) [env: VOXWIRE_REPLICA_ID]" in help_text
    assert "(default: cuda when available) [env: VOXWIRE_DEVICE]" in help_text
    assert "(default: None)" not in help_text


def test_a_setting_whose_type_is_not_a_class_is_refused_naming_it() -> None:
    with pytest.raises(TypeError, match=r"Pace\.pace: a setting's type is a class"):
        groups(PacedConfig)
