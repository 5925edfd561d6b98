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

import enum
import io
import pickle
import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from voxwire.chunk import EMPTY_AUDIO, EngineStep, Patch
from voxwire.engine import Chunk, EngineStats, FinishReason, Request
from voxwire.errors import VoxwireError
from voxwire.prompt import VoicePrompt
from voxwire.serving.speech.persona_names import PersonaInfo
from voxwire.serving.speech.voice_store import Voice
from voxwire.speech_model import ModelInfo
from voxwire.voice_clip import VoiceClip


def frontend_identity(index: int) -> bytes:
    """The DEALER identity of frontend ``index``; a restarted frontend keeps its index, hence its identity."""
    return f"frontend-{index}".encode()


def dumps(message: object) -> bytes:
    return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)


class BadFrame(VoxwireError):
    """A frame on the engine socket that is not a message of this protocol: not a pickle, a pickle naming a
    callable the protocol never sends (a ``__reduce__`` gadget), or a value of another type. The receiver logs
    it and drops it; it never ends the process."""


DATA_TYPES = frozenset(
    {
        ("numpy", "dtype"), ("numpy", "ndarray"),
        ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"),
        ("voxwire.chunk", "EngineStep"),
        ("voxwire.engine.loop", "EngineStats"), ("voxwire.engine.latency", "LatencyHistogram"),
        ("voxwire.engine.request", "Request"), ("voxwire.engine.request", "Priority"),
        ("voxwire.finish_reason", "FinishReason"),
        ("voxwire.params", "SynthesisParams"),
        ("voxwire.prompt", "prompt_from_arrays"),
        ("voxwire.serving.speech.persona_names", "PersonaInfo"),
        ("voxwire.serving.speech.voice_store", "Voice"), ("voxwire.serving.speech.voice_store", "VoiceInfo"),
        ("voxwire.speech_model", "ModelInfo"),
        ("voxwire.voice_clip", "VoiceClip"),
    }
)  # fmt: skip
"""The globals a message of this protocol may name besides its own classes and exceptions: the types its fields
hold, rebuilt through their constructors or builder functions where they carry checks (tests/workers/test_ipc.py
pickles every message, fields filled, and fails on a missing or unused entry; numpy's names for an array are
listed for numpy 1 and 2, contiguous or not)."""


ENUM_BY_NAME = ("builtins", "getattr")
"""How Python 3.11's early releases (3.11.2: Debian 12's) pickle an enum member: ``getattr(its class, its name)``. A
frame may name it only for a member of an enum of ``DATA_TYPES`` (``_enum_member``)."""


def loads(data: bytes, expected: frozenset[type] | None = None) -> object:
    """Decode one message frame (``BadFrame`` for anything that is not one of ``expected``, by default any
    message of the protocol)."""
    try:
        message = _Unpickler(io.BytesIO(data)).load()
    except BadFrame:
        raise
    except Exception as exc:  # a truncated or foreign frame fails in many ways inside pickle
        raise BadFrame(f"not a message of the engine protocol ({type(exc).__name__}: {exc})") from None
    if type(message) not in (MESSAGE_TYPES if expected is None else expected):
        raise BadFrame(f"not a message of the engine protocol (a {type(message).__name__})")
    return message


class _Unpickler(pickle.Unpickler):
    """Resolves only the globals a message may name: its own classes, ``DATA_TYPES``, and exceptions (a refusal
    or failure travels as one) defined in ``builtins`` or an already imported voxwire module."""

    def find_class(self, module: str, name: str) -> Any:
        if (module == __name__ and name in _MESSAGE_NAMES) or (module, name) in DATA_TYPES:
            return super().find_class(module, name)
        if (module, name) == ENUM_BY_NAME:
            return _enum_member
        if module == "builtins" or (module.startswith("voxwire.") and module in sys.modules):
            found = getattr(sys.modules[module], name, None) if "." not in name else None
            if isinstance(found, type) and issubclass(found, BaseException):
                return found
        raise BadFrame(f"a frame names {module}.{name}, which no message of the engine protocol holds")


def _enum_member(cls: object, name: str) -> enum.Enum:
    """``getattr(cls, name)`` as a frame may ask for it: only a member of an enum of ``DATA_TYPES``."""
    if not (isinstance(cls, type) and issubclass(cls, enum.Enum) and (cls.__module__, cls.__name__) in DATA_TYPES):
        raise BadFrame(f"a frame asks for an attribute of {cls!r}, which is not an enum of the engine protocol")
    return cls[name]


# ---- frontend -> engine -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Hello:
    """A frontend (re)started: the engine forgets the requests of any previous process with its identity. To a
    restarted engine 0 it brings the frontend's voices, so the hub can rebuild its set (``Hub.joined``)."""

    pid: int
    voices: tuple[Voice, ...] = ()
    deleted: tuple[str, ...] = ()
    """Ids of the voices the frontend saw deleted."""


@dataclass(frozen=True, slots=True)
class Add:
    request: Request


@dataclass(frozen=True, slots=True)
class Abort:
    request_id: str


@dataclass(frozen=True, slots=True)
class EncodeVoice:
    """Run the model's voice encoder on a clip (``SpeechModel.make_prompt``)."""

    call_id: int
    clip: VoiceClip


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
    owner: str | None
    """The requester's key digest (``OWNER_KEY``), None without a key."""


@dataclass(frozen=True, slots=True)
class RemovePersona:
    call_id: int
    name: str
    owner: str | None
    """The requester's key digest (``OWNER_KEY``), None without a key: ``PersonaRegistry.remove`` decides."""


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
    voices: tuple[Voice, ...]
    personas: tuple[str, ...] | None
    """The registered personas' names; None: the model has no LoRA layers (the simulator)."""


@dataclass(frozen=True, slots=True)
class Outputs:
    """One engine step's outputs for the requests of one frontend (and the engine's load after it), but
    their audio: per row (request id, samples, finish reason, error, patch, queue wait, step, prompt positions); the
    samples follow in a frame. The rows of one step share its ``EngineStep``, which pickles once (pickle's memo
    refers back to it)."""

    rows: list[
        tuple[str, int, FinishReason | None, str | None, Patch | None, float | None, EngineStep | None, int | None]
    ]
    stats: EngineStats


def pack_outputs(outputs: list[Chunk], stats: EngineStats) -> tuple[bytes, npt.NDArray[np.float32]]:
    """The two frames of an ``Outputs`` message."""
    rows = [
        (o.request_id, o.audio.size, o.finish_reason, o.error, o.patch, o.queued_s, o.step, o.prompt_positions)
        for o in outputs
    ]
    audio = np.concatenate([o.audio for o in outputs]) if outputs else EMPTY_AUDIO
    return dumps(Outputs(rows, stats)), audio


def unpack_outputs(message: Outputs, audio: bytes) -> list[Chunk]:
    samples = np.frombuffer(audio, dtype=np.float32)
    outputs, start = [], 0
    for request_id, size, finish_reason, error, patch, queued_s, step, prompt in message.rows:
        row = samples[start : start + size]
        outputs.append(Chunk(request_id, row, finish_reason, error, patch, queued_s, step, prompt))
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
    them); ``error``: ``UnknownPersonaError``, ``PersonaLoadError``, ``PersonaOwnerError`` or an unexpected
    failure."""

    call_id: int
    infos: tuple[PersonaInfo, ...] = ()
    error: BaseException | None = None


TO_ENGINE: frozenset[type] = frozenset(
    {
        Hello, Add, Abort, EncodeVoice, VoiceSaved, VoiceDeleted, Applied, AddPersona, RemovePersona, ListPersonas,
        PersonasPublished,
    }
)  # fmt: skip
"""The messages a frontend sends; the engine drops any other."""
TO_FRONTEND: frozenset[type] = frozenset(
    {Welcome, Outputs, Rejected, Heartbeat, VoiceEncoded, VoicesChanged, PersonasChanged, Synced, PersonaReply}
)
"""The messages an engine sends; a frontend drops any other."""
MESSAGE_TYPES = TO_ENGINE | TO_FRONTEND
"""Every message of the protocol: a frame decoding to anything else is a ``BadFrame``."""
_MESSAGE_NAMES = frozenset(kind.__name__ for kind in MESSAGE_TYPES)
