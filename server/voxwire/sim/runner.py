"""``SimRunner``: the engine's ``Runner`` for load tests, with no model: it sleeps and plays a speech clip.

Each step takes as long as the cost model says (``StepCost.seconds(rows, prefill_tokens)``, measured
from the step's start, so the runner's own bookkeeping counts against it) and gives every row the
next chunk of a speech clip, looped, from an offset drawn from the request's seed. An utterance stops
like a model's does: after a number of chunks proportional to its text (a speaking rate, jittered per
seed), with the same length cap rule as the real runner. Everything that is not the model (scheduler,
engine thread, serving, encoders, sockets) runs for real, which is what a load test measures.
"""

from __future__ import annotations

import math
import random
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from voxwire.engine.cost_model import StepCost
from voxwire.engine.outputs import PrefillItem, RunnerOutput, StepPlan
from voxwire.engine.request import Prepared, Request
from voxwire.prompt import VoicePrompt

_BLOCK_SIZE = 16
DEFAULT_SIM_COST = "4ms+0.17ms/row+9.2us/token"
"""An optimised VoxCPM2 step on one H200 (gpu-scale-review.md): 768 rows take ~135 ms per 160 ms chunk."""


@dataclass(frozen=True, slots=True)
class SimConfig:
    """How the simulated model paces and shapes its output."""

    cost: StepCost = field(default_factory=lambda: StepCost.parse(DEFAULT_SIM_COST))
    """Duration of one step as a function of its decode rows and prefill positions."""
    sample_rate: int = 48000
    """Output rate (VoxCPM2's)."""
    samples_per_patch: int = 7680
    """Samples per chunk: 160 ms at 48 kHz, like VoxCPM2 (4 latent frames of 40 ms)."""
    chars_per_second: float = 15.0
    """Speaking rate: an utterance lasts ``len(text) / chars_per_second`` seconds, +-``length_jitter``."""
    length_jitter: float = 0.15
    """Relative spread of utterance lengths, drawn from the request's seed."""

    def __post_init__(self) -> None:
        for name in ("sample_rate", "samples_per_patch"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"SimConfig.{name}={value!r} is invalid: must be an int >= 1")
        if not (math.isfinite(self.chars_per_second) and self.chars_per_second > 0):
            raise ValueError(f"SimConfig.chars_per_second={self.chars_per_second!r} is invalid: must be > 0")
        if not 0 <= self.length_jitter < 1:
            raise ValueError(f"SimConfig.length_jitter={self.length_jitter!r} is invalid: must be in [0, 1)")

    @property
    def chunk_seconds(self) -> float:
        return self.samples_per_patch / self.sample_rate


def text_tokens(text: str) -> int:
    """The simulated tokenizer's count: about one token per 3 bytes of UTF-8, like a BPE on English."""
    return len(text.encode()) // 3 + 1


def prompt_positions(text: str, voice: VoicePrompt | None) -> int:
    """A prompt's positions by the simulated tokenizer: the text's, and a voice's transcript's and latents' (each
    clip with a start and an end position)."""
    if voice is None:
        return text_tokens(text)
    clips = (voice.audio_patches, voice.reference_patches)
    latents = sum(0 if patches is None else patches.shape[0] + 2 for patches in clips)
    return text_tokens(text) + (text_tokens(voice.text) if voice.text else 0) + latents


@dataclass(slots=True)
class _Row:
    """A running request: where it is in the clip and after how many chunks it stops."""

    offset: int
    chunks: int


class SimRunner:
    """A ``Runner`` whose steps sleep per ``config.cost`` and emit ``clip`` (float32 at ``config.sample_rate``)."""

    def __init__(
        self,
        clip: npt.NDArray[np.float32],
        num_slots: int,
        config: SimConfig | None = None,
        *,
        max_length: int = 4096,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        """``sleep`` and ``clock`` are injectable so tests can check the pacing without waiting for it."""
        self.config = config if config is not None else SimConfig()
        if num_slots < 1:
            raise ValueError(f"num_slots={num_slots} is invalid: must be >= 1")
        if clip.ndim != 1 or clip.size < self.config.samples_per_patch:
            raise ValueError(f"the clip must be 1-D and hold at least one chunk, got shape {clip.shape}")
        self._num_slots = num_slots
        self.max_length = max_length
        spp = self.config.samples_per_patch
        self._clip_size = clip.size
        # The clip followed by its first chunk: any chunk, even one that wraps, is one slice (a view).
        looped = np.concatenate([clip, clip[:spp]]).astype(np.float32)
        looped.flags.writeable = False
        self._looped = looped
        self._rows: dict[str, _Row] = {}
        self._sleep = sleep
        self._clock = clock

    @property
    def num_slots(self) -> int:
        return self._num_slots

    # The simulator models time, not memory: its KV pool holds every slot at max_length, so only the
    # slots (``--max-sessions``) gate admission.
    @property
    def block_size(self) -> int:
        return _BLOCK_SIZE

    @property
    def num_kv_blocks(self) -> int:
        return 1 + self._num_slots * math.ceil(self.max_length / _BLOCK_SIZE)

    @property
    def graph_captures(self) -> int:
        return 0

    @property
    def graph_capture_seconds(self) -> float:
        return 0.0

    # What the real-time scheduler budgets steps with: the simulator's steps take exactly its cost model.
    @property
    def step_cost(self) -> StepCost:
        return self.config.cost

    @property
    def chunk_seconds(self) -> float:
        return self.config.chunk_seconds

    def prepare(self, request: Request) -> Prepared:
        """The simulated layout's sizes: the text's simulated tokens and its voice's (``prompt_positions``)."""
        voice = request.prompt if isinstance(request.prompt, VoicePrompt) else None  # anything else takes no positions
        positions = prompt_positions(request.text, voice)
        return Prepared(positions, min(positions + self._length_cap(request), self.max_length))

    def execute(self, plan: StepPlan) -> RunnerOutput:
        started = self._clock()
        for request_id in plan.released:
            self._rows.pop(request_id, None)
        caps = {item.request_id: self._admit(item) for item in plan.prefills}
        spp = self.config.samples_per_patch
        chunks = []
        stops = []
        for request_id, index in zip(plan.request_ids, plan.step_indices, strict=True):
            row = self._rows[request_id]
            start = (row.offset + index * spp) % self._clip_size
            chunks.append(self._looped[start : start + spp])
            stops.append(index + 1 >= row.chunks)
        prefill_tokens = sum(item.prepared.prompt_positions for item in plan.prefills)
        remaining = started + self.config.cost.seconds(len(plan.request_ids), prefill_tokens) - self._clock()
        if remaining > 0:
            self._sleep(remaining)
        return RunnerOutput(tuple(chunks), tuple(stops), caps)

    def _admit(self, item: PrefillItem) -> int:
        """Start a request's row; returns its length cap (the real runner's rule, on simulated tokens)."""
        request: Request = item.request
        params = request.params
        seed = params.seed if params.seed is not None else secrets.randbits(32)
        draw = random.Random(seed)
        config = self.config
        seconds = len(request.text) / config.chars_per_second
        jitter = 1.0 + config.length_jitter * (2.0 * draw.random() - 1.0)
        # The stop head only counts past min_len, as in the real model, so stop after it.
        chunks = max(math.ceil(seconds * jitter / config.chunk_seconds), params.min_len + 2)
        offset = draw.randrange(self._clip_size)
        self._rows[item.request_id] = _Row(offset, chunks)
        return self._length_cap(request)

    def _length_cap(self, request: Request) -> int:
        """The real runner's rule on simulated tokens: ``min(tokens * 6 + 10, max_len)``, within ``max_length``."""
        return min(int(text_tokens(request.text) * 6 + 10), request.params.max_len, self.max_length)
