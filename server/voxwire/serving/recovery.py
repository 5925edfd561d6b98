"""How the server outlives its engine: when an engine step counts as stuck, and when deaths are a crash loop.

Both topologies use these two rules: the supervisor of ``--workers``/``--devices`` for its engine processes
(``workers.supervisor``, with the life rule of ``workers.liveness``), and ``SpeechService`` for the engine thread
of ``--workers 0``. An engine that dies, or is ended as hung, is replaced while the server stays up; only a
crash loop (``--crash-loop-deaths`` within ``--crash-loop-window-s``) ends the server, so that its orchestrator
sees a failure it cannot fix by waiting.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from voxwire.engine import Runner
from voxwire.engine.outputs import RealtimeRunner
from voxwire.serving.server_config import ServerConfig


def step_stall_bound_s(runner: Runner, config: ServerConfig) -> float:
    """How long one engine step may run before it counts as stuck: ``--stall-factor`` times the worst step the
    runner's start-up cost fit predicts (every slot decoding, ``--max-prefill-tokens-per-step`` positions
    admitted), and never less than ``--stall-timeout-s``. A runner that states no cost gets the floor."""
    topology = config.topology
    worst_s = 0.0
    if isinstance(runner, RealtimeRunner):
        worst_s = runner.step_cost.seconds(runner.num_slots, config.engine.max_prefill_tokens_per_step)
    return max(topology.stall_timeout_s, topology.stall_factor * worst_s)


class CrashLoop:
    """Counts one kind of child's deaths; ``died`` says when they have become a crash loop."""

    def __init__(self, config: ServerConfig, what: str, clock: Callable[[], float] = time.monotonic) -> None:
        """``what``: whose deaths these are (``engine``, ``frontend``), for ``describe``."""
        self.what = what
        self.limit = config.topology.crash_loop_deaths
        self.window_s = config.topology.crash_loop_window_s
        self._clock = clock
        self._deaths: deque[float] = deque()

    def died(self) -> bool:
        """Count one death now; True when ``limit`` deaths fell within the last ``window_s`` (stop replacing)."""
        now = self._clock()
        self._deaths.append(now)
        while self._deaths and now - self._deaths[0] > self.window_s:
            self._deaths.popleft()
        return len(self._deaths) >= self.limit

    def describe(self) -> str:
        return (
            f"{self.limit} {self.what} deaths within {self.window_s:g} s, a crash loop "
            "(--crash-loop-deaths, --crash-loop-window-s)"
        )
