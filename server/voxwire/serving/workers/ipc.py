"""The messages between the engine process and the frontend processes (``voxwire serve --workers N``).

Transport: one ZeroMQ ROUTER socket in the engine process, one DEALER per frontend (identity
``frontend-<index>``), over a Unix-domain ``ipc://`` endpoint. Every message is one pickled value of
the classes below (both ends are the same program, and the socket is private to the server's user).
Audio rides in ``Outputs``: one message per engine step per frontend, holding every row that frontend
owns, never one message per row. It is two frames: the pickled ``Outputs`` (ids, sizes, finish
reasons), then the step's audio for that frontend as one float32 buffer (``pack_outputs``): pickling
a few hundred arrays one by one costs ~10x more than one concatenation, and the frontend's chunks are
zero-copy views of the buffer it receives (``unpack_outputs``).

Engine 0 is the hub of what every frontend must see alike (saved voices, the persona names): a change is
announced to it, it tells every frontend (``VoicesChanged``, ``PersonasChanged``), and once each has
answered ``Applied`` it answers the announcer ``Synced``, so a client's next request finds the change on
any frontend.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from voxwire.chunk import EMPTY_AUDIO, Patch
from voxwire.engine import Chunk, EngineStats, FinishReason, Request
from voxwire.prompt import VoicePrompt
from voxwire.serving.personas import PersonaInfo
from voxwire.serving.voices import Voice
from voxwire.speech_model import ModelInfo, PromptLength


def frontend_identity(index: int) -> bytes:
    """The DEALER identity of frontend ``index``; a restarted frontend keeps its index, hence its identity."""
    return f"frontend-{index}".encode()


def dumps(message: object) -> bytes:
    return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)


def loads(data: bytes) -> object:
    return pickle.loads(data)


# ---- frontend -> engine -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Hello:
    """A frontend (re)started: the engine forgets the requests of any previous process with its identity."""

    pid: int


@dataclass(frozen=True, slots=True)
class Add:
    request: Request


@dataclass(frozen=True, slots=True)
class Abort:
    request_id: str


@dataclass(frozen=True, slots=True)
class EncodeVoice:
    """Run the model's voice encoder on a clip (``SpeechModel.make_prompt`` keyword arguments)."""

    call_id: int
    kwargs: dict[str, Any]


@dataclass(frozen=True, slots=True)
class VoiceSaved:
    """A frontend stored a voice: the engine keeps it and tells the other frontends, then answers ``VoicesSynced``."""

    call_id: int
    voice: Voice


@dataclass(frozen=True, slots=True)
class VoiceDeleted:
    call_id: int
    voice_id: str


@dataclass(frozen=True, slots=True)
class Applied:
    """A frontend applied ``VoicesChanged`` or ``PersonasChanged`` (its ``sync``)."""

    sync: tuple[bytes, int]


@dataclass(frozen=True, slots=True)
class AddPersona:
    """Load a LoRA checkpoint folder as a persona (``PersonaRegistry.add``); answered by ``PersonaReply``."""

    call_id: int
    name: str
    path: str


@dataclass(frozen=True, slots=True)
class RemovePersona:
    call_id: int
    name: str


@dataclass(frozen=True, slots=True)
class ListPersonas:
    call_id: int


@dataclass(frozen=True, slots=True)
class PersonasPublished:
    """A frontend changed the personas (on every engine): engine 0 tells every frontend its names, then answers
    ``Synced``."""

    call_id: int


# ---- engine -> frontend -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Welcome:
    """The answer to ``Hello``: what the model is, and every voice saved so far."""

    info: ModelInfo
    patch_shape: tuple[int, int]
    prompt_length: PromptLength
    voices: tuple[Voice, ...]
    personas: tuple[str, ...] | None
    """The registered personas' names; None: the model has no LoRA layers (the simulator)."""


@dataclass(frozen=True, slots=True)
class Outputs:
    """One engine step's outputs for the requests of one frontend (and the engine's load after it), but
    their audio: per row (request id, samples, finish reason, error, patch); the samples follow in a frame."""

    rows: list[tuple[str, int, FinishReason | None, str | None, Patch | None]]
    stats: EngineStats


def pack_outputs(outputs: list[Chunk], stats: EngineStats) -> tuple[bytes, npt.NDArray[np.float32]]:
    """The two frames of an ``Outputs`` message."""
    rows = [(o.request_id, o.audio.size, o.finish_reason, o.error, o.patch) for o in outputs]
    audio = np.concatenate([o.audio for o in outputs]) if outputs else EMPTY_AUDIO
    return dumps(Outputs(rows, stats)), audio


def unpack_outputs(message: Outputs, audio: bytes) -> list[Chunk]:
    samples = np.frombuffer(audio, dtype=np.float32)
    outputs, start = [], 0
    for request_id, size, finish_reason, error, patch in message.rows:
        outputs.append(Chunk(request_id, samples[start : start + size], finish_reason, error, patch))
        start += size
    return outputs


@dataclass(frozen=True, slots=True)
class Rejected:
    """The engine refused a request (queue full, a parameter past a limit); its stream raises ``error``."""

    request_id: str
    error: BaseException


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """Sent to every frontend while the engine is idle, so their load gauges stay current."""

    stats: EngineStats


@dataclass(frozen=True, slots=True)
class VoiceEncoded:
    call_id: int
    prompt: VoicePrompt | None = None
    error: BaseException | None = None


@dataclass(frozen=True, slots=True)
class VoicesChanged:
    """Another frontend saved or deleted voices; answer ``Applied(sync)`` once they are in the store."""

    sync: tuple[bytes, int]
    """The origin frontend's identity and its call id."""
    saved: tuple[Voice, ...] = ()
    deleted: tuple[str, ...] = field(default_factory=tuple)


@dataclass(frozen=True, slots=True)
class PersonasChanged:
    """The personas' names now (engine 0's); answer ``Applied(sync)`` once requests are checked against them."""

    sync: tuple[bytes, int]
    names: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Synced:
    """Every frontend concerned has the change of the origin's call ``call_id``: the request that made it may
    answer."""

    call_id: int


@dataclass(frozen=True, slots=True)
class PersonaReply:
    """The answer to ``AddPersona`` (the persona), ``RemovePersona`` (nothing) or ``ListPersonas`` (all of
    them); ``error``: ``UnknownPersonaError``, ``PersonaLoadError`` or an unexpected failure."""

    call_id: int
    infos: tuple[PersonaInfo, ...] = ()
    error: BaseException | None = None
