"""The crash-loop rule (``recovery.CrashLoop``), on a clock the test moves: deaths count only within the window."""

from __future__ import annotations

from voxwire.serving.recovery import CrashLoop
from voxwire.serving.server_config import ServerConfig


def test_deaths_are_a_crash_loop_only_within_the_window() -> None:
    now = [0.0]
    loop = CrashLoop(ServerConfig.of(crash_loop_deaths=3, crash_loop_window_s=60.0), "engine", clock=lambda: now[0])
    assert not loop.died()
    now[0] = 30.0
    assert not loop.died()
    now[0] = 61.0  # the first death has left the window: two within it
    assert not loop.died()
    now[0] = 89.0  # the deaths at 30, 61 and 89 fall within 60 s
    assert loop.died()
    assert loop.describe().startswith("3 engine deaths within 60 s, a crash loop")
