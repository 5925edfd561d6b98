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


def test_the_batch_flags_reach_the_engine() -> None:
    engine = engine_config_of("--max-sessions", "40", "--max-batch-gap-ms", "250")
    assert (engine.max_batch_running, engine.max_batch_gap_s) == (10, 0.25)  # a quarter of the slots by default
    assert engine_config_of("--max-batch-sessions", "3").max_batch_running == 3


def test_the_ahead_limit_is_30_s_unless_the_default_bound_is_higher() -> None:
    assert ServerConfig.of().engine.ahead_limit_ms == 30_000
    assert ServerConfig.of(max_ahead_ms=60_000).engine.ahead_limit_ms == 60_000
    assert ServerConfig.of(max_ahead_ms=500, max_ahead_limit_ms=800).engine.ahead_limit_ms == 800


@pytest.mark.parametrize(
    ("field", "value"),
    [("playback_lead_ms", -1), ("playback_lead_ms", 10_001), ("playback_lead_ms", 0.5), ("max_ahead_ms", 0),
     ("realtime", 1), ("max_batch_sessions", 0), ("max_batch_sessions", 17), ("max_batch_gap_ms", 0),
     ("max_ahead_limit_ms", 999)],
)  # fmt: skip
def test_bad_real_time_settings_are_refused(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        ServerConfig.of(**{field: value})
