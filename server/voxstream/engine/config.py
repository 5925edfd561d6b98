"""``EngineConfig``: the engine's capacity and admission knobs, validated on construction.

Only what the scheduler and the request validation read lives here; model and device settings
belong to the runner, network limits to the server.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from voxstream.engine.request import ParamLimits


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Capacity of the micro-batcher. See ``scheduler.admit_count`` for how the knobs combine."""

    max_running: int = 16
    """Most sessions decoded together (batch rows); at most the runner's ``num_slots``."""
    max_waiting: int = 64
    """Length of the FIFO waiting queue; ``add`` raises ``QueueFullError`` beyond it."""
    max_prefill_tokens_per_step: int = 512
    """Prefill work admitted into one step, in prompt positions, so arrivals add bounded latency
    to the step every running stream shares. One request is admitted even if it alone exceeds it."""
    limits: ParamLimits = field(default_factory=ParamLimits)
    """Bounds on per-request synthesis parameters."""

    def __post_init__(self) -> None:
        # Every request passes through the waiting queue, so max_waiting=0 would refuse all work.
        for name in ("max_running", "max_waiting", "max_prefill_tokens_per_step"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"EngineConfig.{name}={value!r} is invalid: must be an int >= 1")
