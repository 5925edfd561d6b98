"""``EngineConfig`` and ``RunnerOptions``: the engine's capacity and admission knobs, and how its runner is
sized, each validated on construction.

``EngineConfig`` is what the scheduler and the request validation read; ``RunnerOptions`` is what a runner is
built by (``ModelRunner``, and ``SpeechModel.new_runner`` for whichever model serves). Network limits belong to
the server, which derives both from its own configuration.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from voxwire.engine.request import ParamLimits

DEFAULT_BLOCK_SIZE = 16
"""Positions per KV block."""


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
    """How far ahead of its listener a stream may run, for requests that state no bound of their own
    (``Request.max_ahead_s``); real-time policy only."""
    max_batch_running: int | None = None
    """Most slots batch requests (``Priority.BATCH``) hold at once, so that real-time requests always find the rest;
    None: no cap but ``max_running``."""
    max_batch_gap_s: float = 1.0
    """The batch guarantee (``policy``, rules B2 and B4): a running batch row decodes at least once this often, and a
    batch request that has waited this long queues as a real-time one would."""
    max_step_load: float | None = None
    """The share of a chunk's duration a step of every committed stream may take, at the measured step cost, before
    new streams are refused (``OverBudgetError``; ``policy``, rule 7); None: none is refused. Real-time policy only."""
    persona_slots_per_owner: int | None = None
    """Most LoRA persona slots one owner's running requests hold at once (distinct personas, ``Request.owner``);
    a request over it waits. None: no cap. Persona slots are the runner's (``PersonaRunner``)."""
    max_persona_wait_s: float = 20.0
    """A request waiting this long for a persona slot ends ``FinishReason.BUSY`` without running."""
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
        for name in ("max_ahead_s", "max_persona_wait_s", "max_batch_gap_s"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"EngineConfig.{name}={value!r} is invalid: must be a finite number > 0")
        load = self.max_step_load
        if load is not None and not (load > 0 and math.isfinite(load)):
            raise ValueError(f"EngineConfig.max_step_load={load!r} is invalid: must be None or a finite number > 0")
        batch = self.max_batch_running
        if batch is not None and (not isinstance(batch, int) or isinstance(batch, bool) or batch < 1):
            raise ValueError(f"EngineConfig.max_batch_running={batch!r} is invalid: must be None or an int >= 1")
        cap = self.persona_slots_per_owner
        if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool) or cap < 1):
            raise ValueError(f"EngineConfig.persona_slots_per_owner={cap!r} is invalid: must be None or an int >= 1")


@dataclass(frozen=True, slots=True)
class RunnerOptions:
    """How a runner is sized and what it measures. A runner reads the options that apply to it: the simulator
    (``voxwire.sim``) only ``num_slots`` and ``max_length``, and paces its steps by its own cost model."""

    num_slots: int
    """Most sessions decoded together (batch rows)."""
    max_length: int | None = None
    """Most LM positions one session may reach (prompt + patches); None: the model's."""
    kv_cache_bytes: int | None = None
    """Device memory of the KV block pool. None: on CUDA, what is free after the weights and a profiled step at
    the largest batch, times ``gpu_memory_utilization``; on other devices, room for every slot at ``max_length``
    (the dense equivalent)."""
    block_size: int = DEFAULT_BLOCK_SIZE
    """Positions per KV block."""
    gpu_memory_utilization: float = 0.9
    """Fraction of the device's memory the process may use in all (for the default ``kv_cache_bytes``)."""
    cuda_graphs: bool | None = None
    """Replay decode steps as CUDA graphs; None: on CUDA devices."""
    max_timesteps: int = 100
    """The most CFM timesteps a request may ask for."""
    graph_timesteps: tuple[int, ...] = (10,)
    """Timestep buckets besides ``max_timesteps`` (on CUDA each has its graphs): a row runs in the smallest bucket
    that covers its count, each bucket's rows as their own sub-step (``engine.timestep_buckets``)."""
    voice_cache_bytes: int = 256 * 2**20
    """Device memory for the encoded patches of recently used voices (0: none kept)."""
    measure_cost: bool = False
    """Time steps after the warm-up and state the fitted ``step_cost`` (what the real-time policy budgets with;
    ``engine.calibration``); off, the runner states none."""
    batch_invariant: bool = False
    """Compute every row independently of the rest of its batch, bit for bit (slower; ``kernels.batch_invariant``)."""

    def __post_init__(self) -> None:
        for name in ("num_slots", "block_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}={value!r} is invalid: must be >= 1")
