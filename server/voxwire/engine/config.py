"""``EngineConfig``: the engine's capacity and admission knobs, validated on construction.

Only what the scheduler and the request validation read lives here; model and device settings
belong to the runner, network limits to the server.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from voxwire.engine.request import ParamLimits


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Capacity of the micro-batcher and its scheduling policy (the rules are in ``engine.policy``)."""

    max_running: int = 16
    """Most sessions decoded together (batch rows); at most the runner's ``num_slots``."""
    max_waiting: int = 64
    """Length of the FIFO waiting queue; ``add`` raises ``QueueFullError`` beyond it."""
    max_prefill_tokens_per_step: int = 512
    """Prefill work admitted into one step, in prompt positions, so arrivals add bounded latency
    to the step every running stream shares. One request is admitted even if it alone exceeds it."""
    realtime: bool = False
    """Schedule by playback deadline (``policy.RealtimePolicy``): rows ahead of their listener may
    skip a step and admission is budgeted by estimated step time. Needs a ``RealtimeRunner``; off,
    every running session decodes every step and admission is FIFO by ``max_prefill_tokens_per_step``."""
    playback_lead_s: float = 0.3
    """The audio a listener buffers before it starts playing, for requests that do not state their own
    (``Request.playback_lead_s``); real-time policy only."""
    max_ahead_s: float = 1.0
    """Sessions with this much audio buffered ahead of their listener skip steps; real-time policy only."""
    limits: ParamLimits = field(default_factory=ParamLimits)
    """Bounds on per-request synthesis parameters."""

    def __post_init__(self) -> None:
        # Every request passes through the waiting queue, so max_waiting=0 would refuse all work.
        for name in ("max_running", "max_waiting", "max_prefill_tokens_per_step"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"EngineConfig.{name}={value!r} is invalid: must be an int >= 1")
        if not (self.playback_lead_s >= 0 and math.isfinite(self.playback_lead_s)):
            raise ValueError(f"EngineConfig.playback_lead_s={self.playback_lead_s!r} is invalid: must be >= 0")
        if not (self.max_ahead_s > 0 and math.isfinite(self.max_ahead_s)):
            raise ValueError(f"EngineConfig.max_ahead_s={self.max_ahead_s!r} is invalid: must be > 0")
