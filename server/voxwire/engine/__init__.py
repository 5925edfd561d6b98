"""The streaming micro-batcher: sans-I/O ``Engine``, its scheduler, its serving cycle (``EngineLoop``), and the
threaded ``AsyncEngine``.

Nothing in this package imports torch except the runner and the modules only it imports (``runner``,
``cuda_graphs``, ``kv_pool``, ``voice_cache``; ``tests/engine/test_no_torch.py`` holds every other module to it),
imported only by whoever builds an engine around a real model.
"""

from __future__ import annotations

from voxwire.chunk import Chunk
from voxwire.engine.async_engine import AsyncEngine
from voxwire.engine.engine import Engine
from voxwire.engine.engine_config import EngineConfig, RunnerOptions
from voxwire.engine.errors import (
    DuplicateRequestError,
    EngineDeadError,
    EngineError,
    EngineRestartingError,
    OverBudgetError,
    QueueFullError,
)
from voxwire.engine.latency import LATENCY_BUCKETS_S, LatencyHistogram
from voxwire.engine.loop import EngineStats
from voxwire.engine.outputs import PrefillItem, Runner, RunnerOutput, StepPlan
from voxwire.engine.request import ParamLimits, Prepared, Priority, Request, RequestStatus
from voxwire.engine.slots import SlotMove
from voxwire.finish_reason import FinishReason
from voxwire.params import SynthesisParams

__all__ = [
    "LATENCY_BUCKETS_S",
    "AsyncEngine",
    "Chunk",
    "DuplicateRequestError",
    "Engine",
    "EngineConfig",
    "EngineDeadError",
    "EngineError",
    "EngineRestartingError",
    "EngineStats",
    "FinishReason",
    "LatencyHistogram",
    "OverBudgetError",
    "ParamLimits",
    "PrefillItem",
    "Prepared",
    "Priority",
    "QueueFullError",
    "Request",
    "RequestStatus",
    "Runner",
    "RunnerOptions",
    "RunnerOutput",
    "SlotMove",
    "StepPlan",
    "SynthesisParams",
]
