"""What several WebSocket test modules share: a sans-I/O ``SessionCore`` with its limits, gate and resolver; a
``Session`` over an in-memory transport; raw-socket clients for the limit probes; the engine's audio for a text and
a signal-to-noise ratio; the ElevenLabs endpoint's messages up to the final one, and their alignments."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import socket
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import numpy as np
from aiohttp import WSMsgType
from aiohttp.test_utils import TestServer

from voxwire.engine import SynthesisParams
from voxwire.protocol.error_codes import ErrorCode
from voxwire.protocol.wire import (
    AudioFrame,
    CloseCode,
    ProtocolError,
    ServerMessage,
    Start,
    decode_server,
    encode,
)
from voxwire.serving.runtime.keys import SPEAKER_KEY, Phase, ServerState
from voxwire.serving.speech.service import SpeechJob
from voxwire.serving.speech.voice_store import VoiceStore
from voxwire.serving.ws.handler import STREAM_PATH
from voxwire.serving.ws.session import Session
from voxwire.serving.ws.session_core import (
    Action,
    Announce,
    SessionCore,
    SessionLimits,
)
from voxwire.serving.ws.utterance import Settings

from .conftest import ClipService, ws_config

LIMITS = SessionLimits(
    max_message_bytes=1024,
    max_messages_per_s=100.0,
    max_text_chars_per_message=100,
    max_text_chars_per_utterance=150,
    max_queued_utterances=2,
    idle_timeout_s=30.0,
)

DELAY_S = 0.3


@dataclass
class Gate:
    """The server's side of an utterance: whether it takes new ones, and how many are live."""

    accepting: bool = True
    live: int = 0

    @contextlib.contextmanager
    def utterance(self) -> Iterator[None]:
        self.live += 1
        try:
            yield
        finally:
            self.live -= 1


def resolve(start: Start) -> Settings:
    """A ``start`` as the server resolves it, minus voices and personas: only ``default`` is a voice."""
    if start.voice not in (None, "default"):
        raise ProtocolError(ErrorCode.UNKNOWN_VOICE, f"no voice {start.voice!r}")
    delay = round(DELAY_S * 1000) if start.max_buffer_delay_ms is None else start.max_buffer_delay_ms
    params = SynthesisParams(seed=start.seed)
    return Settings(start.voice, None, start.format or "opus", params, delay, 400, 1000, bool(start.normalize))


def new_core(gate: Gate | None = None, **limits: Any) -> SessionCore:
    core = SessionCore(SessionLimits(**{**LIMITS.__dict__, **limits}), resolve, gate or Gate(), now=0.0)
    assert core.opened() == [Announce(core.settings)]
    return core


def send(core: SessionCore, message: Any, at: float = 0.0) -> list[Action]:
    return core.receive(encode(message), at)


RATE, PATCH = 48000, 7680


class MemoryTransport:
    """Keeps what the session sends, as a client decodes it; ``gate`` closed means the client is not reading."""

    def __init__(self, *, reading: bool = True) -> None:
        self.sent: list[ServerMessage | AudioFrame] = []
        self.closed: tuple[int, str] | None = None
        self.gate = asyncio.Event()
        if reading:
            self.gate.set()

    async def send(self, message: ServerMessage) -> None:
        await self.gate.wait()
        self.sent.append(decode_server(encode(message)))

    async def send_frame(self, frame: AudioFrame, audio_transport: str) -> None:
        await self.gate.wait()
        self.sent.append(AudioFrame.decode(frame.encode()))

    async def end_context(self, context_id: str | None) -> None:
        raise AssertionError("our protocol's contexts end only when the client closes them")

    async def close(self, code: CloseCode, reason: str) -> None:
        self.closed = (code, reason)

    def of(self, kind: type) -> list:
        return [item for item in self.sent if isinstance(item, kind)]


def new_session(service: ClipService, transport: MemoryTransport, **config: object) -> Session:
    voices = VoiceStore(None, "clip", (2, 4), max_voices=1)
    return Session(service, ws_config(**config), voices, ServerState(phase=Phase.READY), transport)  # type: ignore[arg-type]


def noise(patches: int) -> np.ndarray:
    return np.random.default_rng(0).uniform(-0.5, 0.5, patches * PATCH).astype(np.float32)


UPGRADE = {
    "Connection": "Upgrade",
    "Upgrade": "websocket",
    "Sec-WebSocket-Version": "13",
    "Sec-WebSocket-Key": base64.b64encode(os.urandom(16)).decode(),
}


def masked_text_frame(text: str) -> bytes:
    """A client's text frame (RFC 6455: clients mask), for a raw socket."""
    payload = text.encode()
    mask = os.urandom(4)
    length = struct.pack("!BH", 0xFE, len(payload)) if len(payload) >= 126 else struct.pack("!B", 0x80 | len(payload))
    return b"\x81" + length + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


async def stalled_client(host: str, port: int) -> socket.socket:
    """A raw WebSocket client with a tiny receive buffer that will never read after the handshake."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, (host, port))
    key = base64.b64encode(os.urandom(16)).decode()
    request = (
        f"GET {STREAM_PATH} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    await loop.sock_sendall(sock, request.encode())
    assert (await loop.sock_recv(sock, 12)).startswith(b"HTTP/1.1 101")
    return sock


async def engine_audio(server: TestServer, text: str, seed: int) -> np.ndarray:
    service = server.app[SPEAKER_KEY]
    outputs = [output async for output in service.speak(SpeechJob("reference", text, SynthesisParams(seed=seed)))]
    return np.concatenate([output.audio for output in outputs])


def snr_db(reference: np.ndarray, decoded: np.ndarray) -> float:
    return float(10 * np.log10(np.sum(reference**2) / np.sum((decoded - reference) ** 2)))


TIMEOUT_S = 60.0

MULTI = "/v1/text-to-speech/default/multi-stream-input"


async def receive_until_final(ws: aiohttp.ClientWebSocketResponse, finals: int = 1) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    while finals:
        message = await asyncio.wait_for(ws.receive(), TIMEOUT_S)
        assert message.type is WSMsgType.TEXT, message
        messages.append(json.loads(message.data))
        finals -= messages[-1].get("isFinal") is True
    return messages


def alignments(messages: list[dict[str, Any]], key: str = "alignment") -> list[dict[str, list[Any]]]:
    return [message[key] for message in messages if message.get(key)]
