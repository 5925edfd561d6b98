"""What a synthesis request is, and the per-request state the engine keeps while serving it.

``Request`` and ``SynthesisParams`` (defined in the leaf module ``voxwire.params``) are immutable
values a caller builds and validates up front; ``Prepared`` is what the runner made of one when the engine took it
(``Runner.prepare``: its sizes and layout), and ``RequestRecord`` the engine's mutable record of one request
(status, slot, step counter, KV blocks). The finish rule of a decode step lives here
(``RequestRecord.status_after``) because it depends only on the request. This module does not tokenize (the
runner prepares each request and reports its length cap) and does not schedule.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field, fields
from typing import Any

from voxwire.finish_reason import FinishReason
from voxwire.params import SynthesisParams, is_int, require


class RequestStatus(enum.IntEnum):
    """Lifecycle of a request; every status after ``RUNNING`` is final."""

    WAITING = enum.auto()
    RUNNING = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_ERROR = enum.auto()
    FINISHED_BUSY = enum.auto()
    """It waited for a persona slot longer than ``EngineConfig.max_persona_wait_s`` and never ran."""

    @property
    def is_finished(self) -> bool:
        return self > RequestStatus.RUNNING


FINISH_REASONS: dict[RequestStatus, FinishReason] = {
    RequestStatus.FINISHED_STOPPED: FinishReason.STOP,
    RequestStatus.FINISHED_LENGTH: FinishReason.LENGTH,
    RequestStatus.FINISHED_ABORTED: FinishReason.ABORTED,
    RequestStatus.FINISHED_ERROR: FinishReason.ERROR,
    RequestStatus.FINISHED_BUSY: FinishReason.BUSY,
}


class Priority(enum.Enum):
    """Which capacity a request runs in (``engine.policy``, rules B1-B4)."""

    REALTIME = "realtime"
    """Someone is listening: its chunks have playback deadlines (the default)."""
    BATCH = "batch"
    """An offline job (an audiobook, a dataset, a cache warm-up): it runs in the capacity the real-time requests
    leave, and never starves."""


class PersonaWait(enum.Enum):
    """Why a waiting request cannot take a free slot yet: its persona cannot have a device slot now."""

    SLOTS_HELD = "every persona slot is held by running requests of other personas"
    OWNER_CAP = "its client's running requests already hold their cap of persona slots"


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class ParamLimits:
    """Server-configurable bounds on ``SynthesisParams`` (part of ``EngineConfig``)."""

    min_cfg_value: float = 0.0
    max_cfg_value: float = 10.0
    max_inference_timesteps: int = 100
    """Each timestep is a full diffusion pass per patch, so this bounds one request's step cost."""

    def __reduce__(self) -> tuple[type[ParamLimits], tuple[object, ...]]:
        # Unpickled (the engine socket) through the constructor, so its checks run on what a frontend sent.
        return type(self), tuple(getattr(self, field.name) for field in fields(self))

    def __post_init__(self) -> None:
        lo, hi = self.min_cfg_value, self.max_cfg_value
        require(math.isfinite(lo), "min_cfg_value", lo, "must be finite")
        require(math.isfinite(hi), "max_cfg_value", hi, "must be finite")
        require(lo <= hi, "min_cfg_value", lo, f"must be <= max_cfg_value={hi}")
        steps = self.max_inference_timesteps
        require(is_int(steps) and steps >= 1, "max_inference_timesteps", steps, "must be an int >= 1")

    def check(self, params: SynthesisParams) -> None:
        """Raise ``ValueError`` naming the first field of ``params`` outside these limits."""
        lo, hi = self.min_cfg_value, self.max_cfg_value
        require(lo <= params.cfg_value <= hi, "cfg_value", params.cfg_value, f"must be in [{lo}, {hi}]")
        steps = self.max_inference_timesteps
        ok = params.inference_timesteps <= steps
        require(ok, "inference_timesteps", params.inference_timesteps, f"must be <= {steps}")


@dataclass(frozen=True, slots=True)
class Request:
    """One utterance to synthesize: the payload handed to the runner when the request is prefilled."""

    request_id: str
    """Unique among the engine's unfinished requests."""
    text: str
    params: SynthesisParams = field(default_factory=SynthesisParams)
    prompt: Any = None
    """Voice prompt (e.g. cached prompt latents); opaque to the engine, interpreted by the runner."""
    playback_lead_s: float | None = None
    """Audio the listener buffers before it plays (the client's announced lead); None: the engine's
    ``EngineConfig.playback_lead_s``. Only the real-time policy reads it."""
    playback_due: float | None = None
    """For a sentence continuing a stream that is already playing: when its first chunk must have left
    (the listener's buffer runs dry), on the clock ``Engine.step`` is given. None: a new stream, whose
    listener starts its lead after the first chunk leaves. Only the real-time policy reads it."""
    persona: str | None = None
    """Name of a registered LoRA persona, or None for the base model; resolved by the runner at prefill."""
    owner: str | None = None
    """Who the request counts against for per-client caps (``EngineConfig.persona_slots_per_owner``): an API key's
    digest, else its connection; None: nobody's, no cap applies."""
    playback_speed: float = 1.0
    """How fast the listener plays the model's audio: at 2.0 (a tempo change after decoding, ``audio/tempo.py``)
    a chunk plays in half its duration, so its deadlines come twice as often. Only the real-time policy reads it."""
    max_ahead_s: float | None = None
    """How far ahead of its listener the stream may run (``engine.policy``, rule 5): a WebSocket listener buffers
    what it gets, so it has a bound; ``math.inf`` for an HTTP response, whose reader wants the audio as fast as it
    comes (what it has not read waits in the server, at most the request's length cap); None: the engine's
    ``EngineConfig.max_ahead_s``. Only the real-time policy reads it."""
    priority: Priority = Priority.REALTIME
    """Real-time (someone listens) or batch (an offline job: only the capacity real-time requests leave)."""

    def __post_init__(self) -> None:
        rid = self.request_id
        require(isinstance(rid, str) and rid != "", "request_id", rid, "must be a non-empty str")
        require(isinstance(self.text, str) and self.text.strip() != "", "text", self.text, "must be non-empty")
        lead = self.playback_lead_s
        lead_ok = lead is None or (_is_number(lead) and 0 <= lead < math.inf)
        require(lead_ok, "playback_lead_s", lead, "must be None or a finite number >= 0")
        due = self.playback_due
        due_ok = due is None or (_is_number(due) and math.isfinite(due))
        require(due_ok, "playback_due", due, "must be None or a finite number")
        speed = self.playback_speed
        speed_ok = _is_number(speed) and 0 < speed < math.inf
        require(speed_ok, "playback_speed", speed, "must be a finite number > 0")
        ahead = self.max_ahead_s
        ahead_ok = ahead is None or (_is_number(ahead) and ahead > 0 and not math.isnan(ahead))
        require(ahead_ok, "max_ahead_s", ahead, "must be None or a number > 0 (math.inf: no bound)")
        require(isinstance(self.priority, Priority), "priority", self.priority, "must be a Priority")
        persona = self.persona
        require(persona is None or (isinstance(persona, str) and persona != ""), "persona", persona, "must be a name")
        owner = self.owner
        require(owner is None or (isinstance(owner, str) and owner != ""), "owner", owner, "must be a non-empty str")


@dataclass(frozen=True, slots=True)
class Prepared:
    """What the runner made of a request when the engine took it (``Runner.prepare``, once per request): its sizes,
    which the scheduler budgets with, and its layout, which the runner's prefill reads instead of laying the request
    out again (nano-vllm's and vLLM's token ids, made once at ``add``)."""

    prompt_positions: int
    """LM positions its prompt takes: what its prefill computes (``EngineConfig.max_prefill_tokens_per_step`` and
    the real-time step cost count these), reported on its first chunk (``Chunk.prompt_positions``)."""
    kv_positions: int
    """KV positions it can reach: its prompt and its length cap (its KV blocks hold them)."""
    payload: object = None
    """The runner's own layout of the request (``ModelRunner``: its token ids and length cap); opaque to the
    engine."""
    error: str | None = None
    """Why the runner cannot serve the request (a text with no tokens, a voice of the wrong shape); None: it can.
    Such a request is still queued and admitted, and its prefill fails with this message (``RunnerOutput.errors``),
    so it ends like any failed request."""

    @classmethod
    def refused(cls, error: str) -> Prepared:
        """A request the runner cannot serve: it takes one position until its prefill fails with ``error``."""
        return cls(1, 1, None, error)


@dataclass(slots=True, eq=False)
class RequestRecord:
    """The engine's mutable record of one request, from ``add`` to its final output."""

    request: Request
    prepared: Prepared
    """What the runner made of it on ``add`` (``Runner.prepare``): its sizes and its layout."""
    status: RequestStatus = RequestStatus.WAITING
    step_index: int = 0
    """Index of the next patch to generate (the ``i`` of the finish rule)."""
    length_cap: int | None = None
    """Set by the runner at prefill: min(text-length bound, max_len)."""
    blocks: tuple[int, ...] = ()
    """The KV blocks it owns while running."""
    serial: int = 0
    """Arrival order among the engine's requests: FIFO among equals."""
    first_sent_at: float | None = None
    """When its first chunk left (``Engine.mark_sent``); the real-time policy's playback clock."""
    persona_wait: PersonaWait | None = None
    """Why it last could not have its persona while a slot was free for it (None: it has not had to wait)."""
    persona_wait_since: float | None = None
    """When the scheduler first found it waiting for its persona (the clock of ``Engine.step``): it ends ``busy``
    once it waited ``EngineConfig.max_persona_wait_s``."""
    row_weight: float = 1.0
    """What its row costs, in rows at the default timestep count (``policy.RealtimePolicy.weight``, rule 2)."""
    queued_since: float | None = None
    """When a step first found it waiting (the clock of ``Engine.step``): a batch request queues as a real-time one
    once it has waited ``EngineConfig.max_batch_gap_s`` (``engine.policy``, rule B1)."""
    decoded_at: float | None = None
    """When its last step began (admission included; the clock of ``Engine.step``): a batch row that has not
    decoded for ``EngineConfig.max_batch_gap_s`` must (``engine.policy``, rule B2)."""

    @property
    def is_batch(self) -> bool:
        return self.request.priority is Priority.BATCH

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def demand(self) -> float:
        """The rows per chunk duration its stream needs (``engine.policy``, rule 7): its listener plays that many
        chunks in one chunk's duration."""
        return self.row_weight * self.request.playback_speed

    def playback_start(self, default_lead_s: float) -> float | None:
        """When its listener starts playing chunk 0; None while the first chunk has not been sent."""
        if self.request.playback_due is not None:
            return self.request.playback_due
        if self.first_sent_at is None:
            return None
        lead = self.request.playback_lead_s
        return self.first_sent_at + (default_lead_s if lead is None else lead)

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
