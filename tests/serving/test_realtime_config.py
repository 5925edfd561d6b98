"""``voxwire serve``'s real-time flags reach the engine's configuration, and bad values are refused."""

from __future__ import annotations

import pytest

from voxwire.cli.main import build_parser
from voxwire.cli.serve import config_from_args
from voxwire.serving.server_config import ServerConfig


def engine_config_of(*flags: str):
    return config_from_args(build_parser().parse_args(["serve", *flags]), environ={}).engine.engine_config()


def test_real_time_is_on_by_default_with_the_documented_lead_and_horizon() -> None:
    engine = engine_config_of()
    assert (engine.realtime, engine.playback_lead_s, engine.max_ahead_s) == (True, 0.3, 1.0)


def test_the_flags_reach_the_engine() -> None:
    engine = engine_config_of("--no-realtime", "--playback-lead-ms", "450", "--max-ahead-ms", "2500")
    assert (engine.realtime, engine.playback_lead_s, engine.max_ahead_s) == (False, 0.45, 2.5)
    assert engine_config_of("--realtime", "--playback-lead-ms", "0").playback_lead_s == 0.0


@pytest.mark.parametrize(
    ("field", "value"),
    [("playback_lead_ms", -1), ("playback_lead_ms", 10_001), ("playback_lead_ms", 0.5), ("max_ahead_ms", 0),
     ("realtime", 1)],
)  # fmt: skip
def test_bad_real_time_settings_are_refused(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        ServerConfig.of(**{field: value})
