"""WebSocket test material: the app with ``/v1/tts/stream``, a client that speaks the protocol, and a clip service.

* ``ws_server(**config)``: the real app (``make_app`` over the session's tiny model) on a free port.
* ``connect(server)``: a ``StreamClient`` whose ``ready`` has been read.
* ``ClipService``: a stand-in for ``SpeechService`` that "speaks" a fixed clip (real speech from
  espeak-ng) in model-sized chunks, for tests that need known audio or deterministic pacing.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import pytest_asyncio
import soundfile
import soxr
from aiohttp import WSMsgType, web
from aiohttp.test_utils import TestClient, TestServer

from voxwire.engine import Chunk, FinishReason, SynthesisParams
from voxwire.prompt import VoicePrompt
from voxwire.protocol.wire import (
    AudioFrame,
    ClientMessage,
    Done,
    Error,
    Ready,
    Segment,
    ServerMessage,
    decode_server,
    encode,
)
from voxwire.serving.app import make_app
from voxwire.serving.runtime.keys import (
    CONFIG_KEY,
    ENGINES_KEY,
    SESSIONS_KEY,
    SPEAKER_KEY,
    STATE_KEY,
    VOICES_KEY,
    Phase,
    ServerState,
)
from voxwire.serving.server_config import ServerConfig
from voxwire.serving.speech.service import ModelInfo, SpeechJob
from voxwire.serving.speech.voice_store import VoiceStore
from voxwire.serving.ws.handler import STREAM_PATH, add_ws_routes
from voxwire.speech_model import VoxCPMSpeech
from voxwire.tts import VoxCPM

TIMEOUT_S = 60.0
"""Per message: generous, the CPU is shared and the first step of a fresh process is slow."""

SPEECH_TEXT = "The quick brown fox jumps over the lazy dog."

Received = ServerMessage | AudioFrame


def ws_config(**overrides: Any) -> ServerConfig:
    # The engine flat out, as in tests/serving/conftest.py: real-time pacing is tested in test_realtime.py.
    settings: dict[str, Any] = {
        "port": 0, "max_sessions": 4, "max_waiting": 64, "drain_timeout_s": 5.0, "realtime": False,
    }  # fmt: skip
    return ServerConfig.of(**{**settings, **overrides})


def with_ws_routes(app: web.Application) -> web.Application:
    if not any(resource.canonical == STREAM_PATH for resource in app.router.resources()):
        add_ws_routes(app)
    return app


@dataclass
class Heard:
    """Everything one utterance sent, up to and including its ``done``."""

    segments: list[Segment] = field(default_factory=list)
    frames: list[AudioFrame] = field(default_factory=list)
    errors: list[Error] = field(default_factory=list)
    done: Done | None = None

    @property
    def packets(self) -> list[bytes]:
        return [packet for frame in self.frames for packet in frame.packets]

    def pcm(self) -> np.ndarray:
        """The audio of a ``pcm_f32le`` utterance."""
        return np.frombuffer(b"".join(self.packets), dtype="<f4")

    def take(self, received: object) -> None:
        """File a message of this utterance (others, e.g. ``ready``, are not kept)."""
        if isinstance(received, AudioFrame):
            self.frames.append(received)
        elif isinstance(received, Segment):
            self.segments.append(received)
        elif isinstance(received, Error):
            self.errors.append(received)
        elif isinstance(received, Done):
            self.done = received


class StreamClient:
    """A test client of ``/v1/tts/stream`` (``ready`` holds the settings last announced)."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.ready: Ready | None = None

    async def send(self, message: ClientMessage | str) -> None:
        await self.ws.send_str(message if isinstance(message, str) else encode(message))

    async def receive(self, timeout: float = TIMEOUT_S) -> Received:
        message = await self.ws.receive(timeout=timeout)
        if message.type is WSMsgType.BINARY:
            return AudioFrame.decode(message.data)
        assert message.type is WSMsgType.TEXT, f"connection ended: {message.type.name} {message.data!r}"
        decoded = decode_server(message.data)
        if isinstance(decoded, Ready):
            self.ready = decoded
        return decoded

    async def expect(self, kind: type, timeout: float = TIMEOUT_S) -> Any:
        received = await self.receive(timeout)
        assert isinstance(received, kind), f"expected {kind.__name__}, got {received}"
        return received

    async def error(self, code: str) -> Error:
        error = await self.expect(Error)
        assert error.code == code, error
        return error

    async def heard(self) -> Heard:
        """Collect messages until the next ``done``."""
        heard = Heard()
        while heard.done is None:
            heard.take(await self.receive())
        return heard

    async def closed(self, timeout: float = TIMEOUT_S) -> tuple[int | None, str]:
        """Read until the server closes; its close code and reason."""
        while True:
            message = await self.ws.receive(timeout=timeout)
            if message.type in (WSMsgType.CLOSE, WSMsgType.CLOSED, WSMsgType.CLOSING, WSMsgType.ERROR):
                return self.ws.close_code, str(message.extra or "")


Serve = Callable[..., Awaitable[TestServer]]
Connect = Callable[..., Awaitable[StreamClient]]


@pytest_asyncio.fixture
async def ws_server(serve: Serve, tiny_tts: VoxCPM) -> Callable[..., Awaitable[TestServer]]:
    async def start(**overrides: Any) -> TestServer:
        return await serve(app=with_ws_routes(make_app(ws_config(**overrides), model=VoxCPMSpeech(tiny_tts))))

    return start


@pytest_asyncio.fixture
async def connect(aiohttp_client: Callable[..., Awaitable[TestClient]]) -> Connect:
    clients: dict[int, TestClient] = {}

    async def open_stream(server: TestServer, *, read_ready: bool = True, **kwargs: Any) -> StreamClient:
        if id(server) not in clients:
            clients[id(server)] = await aiohttp_client(server)
        stream = StreamClient(await clients[id(server)].ws_connect(STREAM_PATH, **kwargs))
        if read_ready:
            await stream.expect(Ready)
        return stream

    return open_stream


async def until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    """Wait until ``predicate()`` holds, polling."""

    async def poll() -> None:
        while not predicate():
            await asyncio.sleep(0.005)

    await asyncio.wait_for(poll(), timeout)


async def engine_idle(app: web.Application, timeout: float = TIMEOUT_S) -> None:
    """Wait until the engine holds no request (every slot free, nothing queued)."""

    def idle() -> bool:
        stats = app[ENGINES_KEY].engine.stats()
        return not (stats.running or stats.waiting)

    await until(idle, timeout)


# ---- a SpeechService stand-in that plays a clip ------------------------------------------------------------------


class ClipService:
    """Plays ``clip`` for every request, ``patch`` samples per step, ``step_s`` apart; records aborted requests."""

    queue_full = False
    """Never full: every request is played at once."""
    available = True
    """Never restarting: it has no engine to lose."""
    personas = None
    """No personas: a request naming one is refused before it reaches the service."""

    def __init__(self, clip: np.ndarray, rate: int, patch: int, step_s: float = 0.0) -> None:
        self.clip = clip.astype(np.float32)
        self.info = ModelInfo("clip", rate, patch, reference_cloning=True, voice_design=True)
        self.step_s = step_s
        self.requests: list[tuple[str, SynthesisParams, VoicePrompt | None]] = []
        self.timings: list[tuple[float | None, float | None]] = []
        """Per request, the real-time deadline inputs it was given: (playback_lead_s, playback_due)."""
        self.aborted: list[str] = []
        self.chunks_sent = 0
        self._ids = 0

    def pinned(self) -> ClipService:
        return self  # one engine: every connection uses the service itself

    def new_request_id(self, prefix: str = "req") -> str:
        self._ids += 1
        return f"{prefix}-{self._ids}"

    async def speak(self, job: SpeechJob) -> AsyncIterator[Chunk]:
        self.requests.append((job.text, job.params, job.voice))
        self.timings.append((job.options.playback_lead_s, job.options.playback_due))
        patch = self.info.samples_per_patch
        finished = False
        try:
            for start in range(0, self.clip.size, patch):
                await asyncio.sleep(self.step_s)
                chunk = self.clip[start : start + patch]
                patch_latent = np.zeros((2, 4), dtype=np.float32)
                last = start + patch >= self.clip.size
                self.chunks_sent += 1
                finished = last
                yield Chunk(job.request_id, chunk, FinishReason.STOP if last else None, None, patch_latent)
        finally:
            if not finished:
                self.aborted.append(job.request_id)


def clip_app(service: ClipService, **overrides: Any) -> web.Application:
    """A minimal app with only the streaming route, over ``service``."""
    app = web.Application()
    config = ws_config(**overrides)
    app[CONFIG_KEY] = config
    app[ENGINES_KEY] = service  # type: ignore[assignment]
    app[SPEAKER_KEY] = service  # type: ignore[assignment]
    app[VOICES_KEY] = VoiceStore(None, "clip", (2, 4), max_voices=1)
    app[STATE_KEY] = ServerState(phase=Phase.READY)
    app[SESSIONS_KEY] = set()
    add_ws_routes(app)
    return app


def require(binary: str) -> str:
    """Path of an external tool; a missing one fails the test with the Debian package to install (CI has them)."""
    path = shutil.which(binary)
    if path is None:
        package = {"opusinfo": "opus-tools", "opusdec": "opus-tools"}.get(binary, binary)
        pytest.fail(f"`{binary}` not found: install the Debian package `{package}`", pytrace=False)
    return path


@pytest.fixture(scope="session")
def speech(tmp_path_factory: pytest.TempPathFactory) -> Callable[[int], np.ndarray]:
    """``speech(rate)``: about 2.5 s of espeak-ng speech at ``rate``, peaking at 0.9."""
    wav = tmp_path_factory.mktemp("ws-speech") / "speech.wav"
    subprocess.run([require("espeak-ng"), "-w", str(wav), SPEECH_TEXT], check=True, capture_output=True)
    samples, rate = soundfile.read(wav, dtype="float32")
    samples *= np.float32(0.9 / np.abs(samples).max())
    return lambda target: soxr.resample(samples, rate, target).astype(np.float32)
