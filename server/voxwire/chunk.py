"""``Chunk``: one decode step's speech for one stream, the unit the one-utterance API yields, the engine emits
and the serving layer encodes; ``EngineStep``: the engine step that made it. A leaf module (numpy only, no torch,
no engine), so any layer may import it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from voxwire.finish_reason import FinishReason

Audio = npt.NDArray[np.float32]
"""1-D float32 PCM at the model's sample rate: one patch of samples per decode step."""

Patch = npt.NDArray[np.float32]
"""(patch_size, feat_dim) float32 latent patch: what a chunk's audio was decoded from."""

EMPTY_AUDIO: Audio = np.zeros(0, dtype=np.float32)
EMPTY_AUDIO.flags.writeable = False


@dataclass(frozen=True, slots=True)
class EngineStep:
    """One engine step, as its outputs report it: one object per step, shared by every chunk the step made.

    Its times are on the host's wall clock (``time.time_ns()``), which the engine's process shares with the
    frontends, so a frontend can place the step on its own trace (``serving.runtime.tracing``).
    """

    started_ns: int
    """When the step began (its scheduling, before the batched forward pass), in ns since the epoch."""
    duration_ns: int
    """How long the step ran: its scheduling and the runner's batched forward pass."""
    rows: int
    """The step's batch: the streams it decoded one patch for."""

    @property
    def ended_ns(self) -> int:
        return self.started_ns + self.duration_ns


# eq=False: the fields hold arrays, which have no single truth value to compare by. Not frozen: the engine
# makes one per row per step on its thread's hot path, and a frozen init costs 3x; never mutate one.
@dataclass(slots=True, eq=False)
class Chunk:
    """One stream's new audio and, on its last chunk, why the stream finished.

    A stream's chunks end with exactly one that has ``finish_reason`` set. The engine's chunks of aborted or
    failed requests carry empty audio.
    """

    request_id: str
    """The engine request the chunk belongs to ("" from the one-utterance API, which runs one stream)."""
    audio: Audio
    finish_reason: FinishReason | None = None
    error: str | None = None
    """Set with ``FinishReason.ERROR``: what went wrong."""
    patch: Patch | None = None
    """The audio's latent patch, which a caller keeps to continue the voice in a later utterance (a
    continuation prompt). Always set by the one-utterance API; by the engine when its runner reports patches
    (see ``RunnerOutput.patches``)."""
    queued_s: float | None = None
    """On a stream's first output with audio from the engine: how long the request waited for its slot (from
    the engine receiving it to the start of the step that admitted it). None on every other chunk."""
    step: EngineStep | None = None
    """The engine step whose forward pass made the chunk (the same object on all of that step's chunks). None
    from the one-utterance API, and on an engine chunk no step's forward pass made: a stream aborted or expired
    while it waited, or every stream of a step whose runner failed."""
    prompt_positions: int | None = None
    """On a stream's first output with audio from the engine: the LM positions its prompt took (what the engine laid
    out: the text's tokens and the voice's positions; the SSE ``usage``'s input). None on every other chunk."""

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
