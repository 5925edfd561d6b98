"""The streaming micro-batcher: sans-I/O ``Engine``, its scheduler, and the threaded ``AsyncEngine``.

Nothing in this package imports torch except the runner, which lives in its own module and is
imported only by whoever builds an engine around a real model.
"""

from __future__ import annotations

from voxstream.chunk import Chunk
from voxstream.engine.async_engine import AsyncEngine, EngineStats
from voxstream.engine.config import EngineConfig
from voxstream.engine.engine import Engine
from voxstream.engine.errors import DuplicateRequestError, EngineDeadError, EngineError, QueueFullError
from voxstream.engine.outputs import PrefillItem, Runner, RunnerOutput, StepPlan
from voxstream.engine.request import FinishReason, ParamLimits, Request, RequestStatus, SynthesisParams
from voxstream.engine.slots import SlotMove

__all__ = [
    "AsyncEngine",
    "Chunk",
    "DuplicateRequestError",
    "Engine",
    "EngineConfig",
    "EngineDeadError",
    "EngineError",
    "EngineStats",
    "FinishReason",
    "ParamLimits",
    "PrefillItem",
    "QueueFullError",
    "Request",
    "RequestStatus",
    "Runner",
    "RunnerOutput",
    "SlotMove",
    "StepPlan",
    "SynthesisParams",
]
