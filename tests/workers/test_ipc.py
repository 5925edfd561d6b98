"""The engine socket decodes only its own messages (issue 20, item 8): every message of the protocol round-trips
through the restricted unpickler, while a ``__reduce__`` gadget, a pickled tensor (which would unpickle any bytes),
a value of another type, a message the other side sends, or bytes that are no pickle at all, are ``BadFrame``;
and a live engine drops such frames, logs them and keeps serving."""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import io
import os
import pickle
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
import zmq
from tests.server_process import ServerProcess, poll

from voxwire.chunk import Chunk, EngineStep
from voxwire.engine import (
    EngineStats,
    FinishReason,
    LatencyHistogram,
    Priority,
    QueueFullError,
    Request,
    SynthesisParams,
)
from voxwire.errors import InvalidInputError
from voxwire.prompt import VoicePrompt
from voxwire.serving.speech.persona_names import PersonaInfo, PersonaLoadError, PersonaOwnerError, UnknownPersonaError
from voxwire.serving.speech.voice_store import Voice, VoiceInfo
from voxwire.serving.workers import ipc
from voxwire.speech_model import ModelInfo
from voxwire.voice_clip import VoiceClip

from .helpers import TEXT, speak

PROMPT = VoicePrompt("hi", torch.linspace(-1, 1, 64).reshape(2, 4, 8), torch.ones(1, 4, 8))
VOICE = Voice(VoiceInfo("voice_0123456789abcdef", "name", "hi", "model", 1.5, 3, "owner"), PROMPT)
STATS = EngineStats(1, 2, LatencyHistogram().observe(0.1), 4, 5, 6, 0.2, LatencyHistogram().observe(0.03))
CLIP = VoiceClip("A clip.", np.zeros(8, np.float32), 16000, np.ones(8, np.float32), 16000)
STEP = EngineStep(1_796_000_000_000_000_000, 42_000_000, 2)
PERSONA = PersonaInfo("A", "a", 4, 8.0, True, True, False, 0, {"target_modules_lm": ("q_proj",)}, "key-digest")


def every_message() -> list[object]:
    """One of each message of the protocol, every field filled as the server fills it."""
    request = Request("r1", "hello", SynthesisParams(seed=3), PROMPT, 0.3, 1.0, "A")
    info = ModelInfo("model", 16000, 640, True, True)
    patch = np.ones((4, 8), np.float32)
    messages = [
        ipc.Hello(1), ipc.Hello(1, (VOICE,), ("voice_fedcba9876543210",)), ipc.Add(request), ipc.Abort("r1"),
        ipc.EncodeVoice(1, CLIP),
        ipc.VoiceSaved(1, VOICE), ipc.VoiceDeleted(1, "voice_0123456789abcdef"), ipc.Applied((b"frontend-0", 1)),
        ipc.AddPersona(1, "A", "a", "key-digest"), ipc.RemovePersona(1, "A", "key-digest"), ipc.ListPersonas(1),
        ipc.PersonasPublished(1),
        ipc.Welcome(info, (4, 8), (VOICE,), ("A",)),
        ipc.Welcome(info, (4, 8), (), None),
        ipc.Outputs([("r1", 3, FinishReason.STOP, None, patch, 0.25, STEP, 12),
                     ("r2", 0, None, "oops", None, None, None, None)], STATS),
        ipc.Rejected("r1", QueueFullError("full")), ipc.Rejected("r1", ValueError("bad")), ipc.Heartbeat(STATS),
        ipc.VoiceEncoded(1, PROMPT), ipc.VoiceEncoded(1, None, InvalidInputError("not audio")),
        ipc.VoicesChanged((b"frontend-0", 1), (VOICE,), ("voice_0123456789abcdef",)),
        ipc.PersonasChanged((b"frontend-0", 1), ("A",)), ipc.Synced(1),
        ipc.PersonaReply(1, (PERSONA,)), ipc.PersonaReply(1, (), PersonaLoadError("invalid_lora", "no")),
        ipc.PersonaReply(1, (), UnknownPersonaError("who")), ipc.PersonaReply(1, (), PersonaOwnerError("not yours")),
    ]  # fmt: skip
    assert {type(message) for message in messages} == ipc.MESSAGE_TYPES
    return messages


def plain(value: object) -> object:
    """``value`` as comparable plain data: dataclasses by type and fields, tensors and arrays as lists."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = dataclasses.fields(value)
        return type(value).__name__, {field.name: plain(getattr(value, field.name)) for field in fields}
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return str(value.dtype), value.tolist()
    if isinstance(value, BaseException):
        return type(value).__name__, str(value), getattr(value, "code", None)
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    return value


def named_globals(data: bytes) -> set[tuple[str, str]]:
    names: set[tuple[str, str]] = set()

    class Recorder(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> object:
            names.add((module, name))
            return super().find_class(module, name)

    Recorder(io.BytesIO(data)).load()
    return names


def test_every_message_round_trips_and_names_only_what_it_holds() -> None:
    used: set[tuple[str, str]] = set()
    for message in every_message():
        data = ipc.dumps(message)
        decoded = ipc.loads(data)
        assert plain(decoded) == plain(message)  # the same value, field for field
        used |= named_globals(data)
    data_types = {name for name in used if name[0] != ipc.__name__ and not _is_exception(name)}
    numpy_aliases = {name for name in ipc.DATA_TYPES if name[0].startswith(("numpy.core", "numpy._core"))}
    assert data_types - ipc.DATA_TYPES - {ipc.ENUM_BY_NAME} == set()  # the last: on Python 3.11.2, an enum member
    assert ipc.DATA_TYPES - data_types - numpy_aliases - {("numpy", "ndarray")} == set()  # no entry to spare


def _is_exception(name: tuple[str, str]) -> bool:
    found = getattr(__import__(name[0], fromlist=[name[1]]), name[1])
    return isinstance(found, type) and issubclass(found, BaseException)


class Gadget:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.system, (f"touch {self.marker}",)


@pytest.mark.parametrize(
    "frame",
    [
        pytest.param(lambda marker: pickle.dumps(Gadget(marker)), id="reduce-gadget"),
        pytest.param(lambda marker: pickle.dumps(ipc.Add(Gadget(marker))), id="gadget-inside-a-message"),  # type: ignore[arg-type]
        pytest.param(lambda marker: pickle.dumps(torch.zeros(2)), id="a-pickled-tensor"),
        pytest.param(lambda marker: pickle.dumps({"type": "add"}), id="a-value-of-another-type"),
        pytest.param(lambda marker: b"not a pickle at all", id="junk"),
        pytest.param(lambda marker: ipc.dumps(ipc.Hello(1))[:-3], id="truncated"),
        pytest.param(lambda marker: pickle.dumps(ipc.loads), id="a-function-of-the-module"),
    ],
)
def test_frames_that_are_no_message_are_bad_frames(tmp_path: Path, frame) -> None:
    marker = tmp_path / "ran"
    with pytest.raises(ipc.BadFrame):
        ipc.loads(frame(marker))
    assert not marker.exists()


def test_each_side_accepts_only_what_the_other_sends() -> None:
    with pytest.raises(ipc.BadFrame):
        ipc.loads(ipc.dumps(ipc.Heartbeat(STATS)), ipc.TO_ENGINE)
    with pytest.raises(ipc.BadFrame):
        ipc.loads(ipc.dumps(ipc.Hello(1)), ipc.TO_FRONTEND)


def test_a_request_is_checked_again_when_it_arrives() -> None:
    """Unpickling builds a request through its constructor, so a frontend (or an impostor) cannot skip its checks."""
    bad = pickle.dumps(ipc.Add(_Unchecked()), protocol=pickle.HIGHEST_PROTOCOL)  # type: ignore[arg-type]
    with pytest.raises(ipc.BadFrame, match="cfg_value=nan"):
        ipc.loads(bad)
    forged = pickle.dumps(ipc.VoiceEncoded(1, _ForgedPrompt()), protocol=pickle.HIGHEST_PROTOCOL)  # type: ignore[arg-type]
    with pytest.raises(ipc.BadFrame, match="not finite"):
        ipc.loads(forged)


class _Unchecked:
    """Pickles as SynthesisParams(cfg_value=nan), which the constructor refuses."""

    def __reduce__(self) -> tuple[object, tuple[float]]:
        return SynthesisParams, (float("nan"),)


class _ForgedPrompt:
    """Pickles as a voice prompt of non-finite latents, which the prompt's gate refuses."""

    def __reduce__(self) -> tuple[object, tuple[str, np.ndarray, None]]:
        from voxwire.prompt import prompt_from_arrays

        return prompt_from_arrays, ("", np.full((1, 4, 8), np.inf, np.float32), None)


@pytest.mark.slow
def test_a_live_engine_drops_foreign_frames_and_keeps_serving(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    args = ("--model", "sim", "--sim-cost", "5ms", "--workers", "1")
    with ServerProcess(*args, env={"TMPDIR": str(tmp_path)}) as server:
        server.wait_ready()
        endpoint = next(tmp_path.glob("voxwire-*/engine-0"))
        context = zmq.Context()
        try:
            impostor = context.socket(zmq.DEALER)
            impostor.setsockopt(zmq.LINGER, 5000)  # deliver every frame before the socket closes
            impostor.connect(f"ipc://{endpoint}")
            for frame in (b"junk", pickle.dumps(Gadget(marker)), pickle.dumps(torch.zeros(2))):
                impostor.send(frame)
            impostor.send_multipart([b"two", b"frames"])
            impostor.send(ipc.dumps(ipc.Add(_Unchecked())))  # type: ignore[arg-type]
        finally:
            context.destroy(linger=5000)
        assert asyncio.run(speak(server.ws_url, TEXT, seed=1, token=None))[1].finish_reason in ("stop", "length")
        assert not marker.exists()
        assert poll(lambda: server.log.count("dropped a") >= 5, timeout=10), server.log  # the log arrives by a pipe
        assert server.stop() == 0


def test_a_step_message_carries_every_outputs_audio_and_fields() -> None:
    patch = np.ones((2, 4), dtype=np.float32)
    sent = [
        Chunk("r1", np.arange(3, dtype=np.float32), patch=patch, queued_s=0.25, step=STEP, prompt_positions=12),
        Chunk("r3", np.arange(2, dtype=np.float32), FinishReason.STOP, step=STEP),
        Chunk("r2", np.zeros(0, dtype=np.float32), FinishReason.ERROR, "oops"),
    ]
    message, audio = ipc.pack_outputs(sent, STATS)
    decoded = ipc.loads(message)
    assert isinstance(decoded, ipc.Outputs) and decoded.stats == STATS
    received = ipc.unpack_outputs(decoded, audio.tobytes())
    for before, after in zip(sent, received, strict=True):
        assert (after.request_id, after.finish_reason, after.error, after.queued_s, after.step) == (
            before.request_id, before.finish_reason, before.error, before.queued_s, before.step,
        )  # fmt: skip
        assert after.prompt_positions == before.prompt_positions
        assert np.array_equal(after.audio, before.audio)
    assert received[0].patch is not None and np.array_equal(received[0].patch, patch) and received[2].patch is None
    assert received[0].step is received[1].step  # the step's rows share one object after the trip too


def _pickled_as_early_311(message: object, target: Callable[[enum.Enum], tuple[object, str]]) -> bytes:
    """``message`` pickled with each enum member as ``getattr(*target(member))``: ``(type(member), member.name)`` is
    how Python 3.11's early releases (3.11.2, Debian 12's) pickle one."""

    class Pickler(pickle.Pickler):
        def reducer_override(self, obj: object) -> object:
            return (getattr, target(obj)) if isinstance(obj, enum.Enum) else NotImplemented

    frame = io.BytesIO()
    Pickler(frame).dump(message)
    return frame.getvalue()


def test_an_enum_member_pickled_the_early_311_way_arrives_and_nothing_else_does_that_way() -> None:
    """On Python 3.11.2 every frame holding an enum (a request's priority, a chunk's finish reason) was dropped as
    naming builtins.getattr, and a --workers server never became ready."""
    add = ipc.Add(Request("r", "Hi.", priority=Priority.BATCH))
    arrived = ipc.loads(_pickled_as_early_311(add, lambda member: (type(member), member.name)))
    assert isinstance(arrived, ipc.Add) and arrived.request.priority is Priority.BATCH
    for target, name in ((Path, "cwd"), (Priority, "__class__"), (str, "join")):
        with pytest.raises(ipc.BadFrame):
            ipc.loads(_pickled_as_early_311(add, lambda member, target=target, name=name: (target, name)))
