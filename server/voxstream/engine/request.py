"""What a synthesis request is, and the per-request state the engine keeps while serving it.

``Request`` and ``SynthesisParams`` are immutable values a caller builds and validates up front;
``Session`` is the engine's mutable record of one request (status, slot, step counter). The finish
rule of a decode step lives here (``Session.status_after``) because it depends only on the request.
This module does not tokenize (the runner reports each session's length cap) and does not schedule.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Any

from voxstream.errors import InvalidInputError


class RequestStatus(enum.IntEnum):
    """Lifecycle of a request; every status after ``RUNNING`` is final."""

    WAITING = enum.auto()
    RUNNING = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_ERROR = enum.auto()

    @property
    def is_finished(self) -> bool:
        return self > RequestStatus.RUNNING


class FinishReason(str, enum.Enum):
    """Why a stream ended; sent to the client with the last chunk."""

    STOP = "stop"
    LENGTH = "length"
    ABORTED = "aborted"
    ERROR = "error"


FINISH_REASONS: dict[RequestStatus, FinishReason] = {
    RequestStatus.FINISHED_STOPPED: FinishReason.STOP,
    RequestStatus.FINISHED_LENGTH: FinishReason.LENGTH,
    RequestStatus.FINISHED_ABORTED: FinishReason.ABORTED,
    RequestStatus.FINISHED_ERROR: FinishReason.ERROR,
}


def _require(ok: bool, name: str, value: object, rule: str) -> None:
    if not ok:
        raise InvalidInputError(f"{name}={value!r} is invalid: {rule}")


def _is_int(value: object) -> bool:
    # bool is an int subclass, but True as a step count is always a caller's mistake.
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class SynthesisParams:
    """Per-request generation settings; defaults are the reference ``VoxCPM.generate`` defaults.

    ``__post_init__`` rejects values no server could accept; the server-configurable upper bounds
    are checked by ``ParamLimits.check`` when the request is added to an engine.
    """

    cfg_value: float = 2.0
    """Classifier-free guidance scale of the local diffusion."""
    inference_timesteps: int = 10
    """Euler steps of the diffusion sampler per patch."""
    min_len: int = 2
    """The stop head is ignored while the step index is <= min_len."""
    max_len: int = 4096
    """Hard cap on patches (steps); the runner lowers it further from the text length."""
    seed: int | None = None
    """Noise seed for reproducible output; None draws a fresh one."""

    def __post_init__(self) -> None:
        cfg = self.cfg_value
        _require(isinstance(cfg, (int, float)) and not isinstance(cfg, bool), "cfg_value", cfg, "must be a number")
        _require(math.isfinite(cfg), "cfg_value", cfg, "must be finite")
        _require(_is_int(self.inference_timesteps), "inference_timesteps", self.inference_timesteps, "must be an int")
        _require(self.inference_timesteps >= 1, "inference_timesteps", self.inference_timesteps, "must be >= 1")
        _require(_is_int(self.min_len) and self.min_len >= 0, "min_len", self.min_len, "must be an int >= 0")
        _require(_is_int(self.max_len) and self.max_len >= 1, "max_len", self.max_len, "must be an int >= 1")
        seed_ok = self.seed is None or (_is_int(self.seed) and 0 <= self.seed < 2**63)
        _require(seed_ok, "seed", self.seed, "must be None or an int in [0, 2**63)")


@dataclass(frozen=True, slots=True)
class ParamLimits:
    """Server-configurable bounds on ``SynthesisParams`` (part of ``EngineConfig``)."""

    min_cfg_value: float = 0.0
    max_cfg_value: float = 10.0
    max_inference_timesteps: int = 100
    """Each timestep is a full diffusion pass per patch, so this bounds one request's step cost."""

    def __post_init__(self) -> None:
        lo, hi = self.min_cfg_value, self.max_cfg_value
        _require(math.isfinite(lo), "min_cfg_value", lo, "must be finite")
        _require(math.isfinite(hi), "max_cfg_value", hi, "must be finite")
        _require(lo <= hi, "min_cfg_value", lo, f"must be <= max_cfg_value={hi}")
        steps = self.max_inference_timesteps
        _require(_is_int(steps) and steps >= 1, "max_inference_timesteps", steps, "must be an int >= 1")

    def check(self, params: SynthesisParams) -> None:
        """Raise ``ValueError`` naming the first field of ``params`` outside these limits."""
        lo, hi = self.min_cfg_value, self.max_cfg_value
        _require(lo <= params.cfg_value <= hi, "cfg_value", params.cfg_value, f"must be in [{lo}, {hi}]")
        steps = self.max_inference_timesteps
        ok = params.inference_timesteps <= steps
        _require(ok, "inference_timesteps", params.inference_timesteps, f"must be <= {steps}")


@dataclass(frozen=True, slots=True)
class Request:
    """One utterance to synthesize: the payload handed to the runner when the request is prefilled."""

    request_id: str
    """Unique among the engine's unfinished requests."""
    text: str
    prefill_tokens: int
    """The caller's estimate of the prompt length in LM positions; only the admission budget reads it."""
    params: SynthesisParams = field(default_factory=SynthesisParams)
    prompt: Any = None
    """Voice prompt (e.g. cached prompt latents); opaque to the engine, interpreted by the runner."""
    persona: str | None = None
    """Name of a registered LoRA persona, or None for the base model; resolved by the runner at prefill."""

    def __post_init__(self) -> None:
        rid = self.request_id
        _require(isinstance(rid, str) and rid != "", "request_id", rid, "must be a non-empty str")
        _require(isinstance(self.text, str) and self.text.strip() != "", "text", self.text, "must be non-empty")
        tokens = self.prefill_tokens
        _require(_is_int(tokens) and tokens >= 1, "prefill_tokens", tokens, "must be an int >= 1")
        persona = self.persona
        _require(persona is None or (isinstance(persona, str) and persona != ""), "persona", persona, "must be a name")


@dataclass(slots=True, eq=False)
class Session:
    """The engine's mutable record of one request, from ``add`` to its final output."""

    request: Request
    status: RequestStatus = RequestStatus.WAITING
    step_index: int = 0
    """Index of the next patch to generate (the ``i`` of the finish rule)."""
    length_cap: int | None = None
    """Set by the runner at prefill: min(text-length bound, max_len)."""
    kv_positions: int = 1
    """KV positions the request can reach (prompt + length cap), as the runner reported on ``add``."""
    blocks: tuple[int, ...] = ()
    """The KV blocks it owns while running."""

    @property
    def request_id(self) -> str:
        return self.request.request_id

    def status_after(self, stop_flag: bool) -> RequestStatus:
        """Status after emitting the chunk of step ``step_index``, given the runner's raw stop flag.

        The chunk is always emitted first; then the stop head counts only past ``min_len`` (as in
        the reference generate loop), and the length cap ends the stream after ``length_cap`` patches.
        """
        assert self.length_cap is not None, "decoded before its prefill reported a length cap"
        if stop_flag and self.step_index > self.request.params.min_len:
            return RequestStatus.FINISHED_STOPPED
        if self.step_index + 1 >= self.length_cap:
            return RequestStatus.FINISHED_LENGTH
        return RequestStatus.RUNNING
