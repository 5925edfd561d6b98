"""Regression tests of issue 8's probe on the WebSocket side (defects D4, D7, D12).

A connection flooding messages, one queueing utterances without bound, frames aiohttp accepted or
closed on without a reason.
"""

from __future__ import annotations

import asyncio
import base64
import os
import struct
import time
import typing

import numpy as np
import pytest
from aiohttp import WSMsgType

from voxwire.protocol import wire as protocol
from voxwire.protocol.wire import AudioFrame, CloseCode, Done, End, Error, Start, Text, decode_client, encode
from voxwire.serving.http.probes import health
from voxwire.serving.server_config import ServerConfig
from voxwire.serving.ws.handler import STREAM_PATH

from .conftest import ClipService, clip_app
from .helpers import masked_text_frame

STEP_S = 0.1
"""The stand-in engine's step: one chunk per step."""


def step_service(seconds: float = 2.0) -> ClipService:
    rate, patch = 16000, 1600
    t = np.arange(int(seconds * rate)) / rate
    return ClipService(0.1 * np.sin(2 * np.pi * 220 * t), rate, patch, step_s=STEP_S)


# ---- D4: no reflection per message, and one connection cannot monopolise the loop ----------------------------


def test_parsing_a_message_does_no_reflection(monkeypatch) -> None:
    def reflection(*args: object, **kwargs: object) -> None:
        raise AssertionError("typing.get_type_hints ran while parsing a message")

    monkeypatch.setattr(typing, "get_type_hints", reflection)
    monkeypatch.setattr(protocol.typing, "get_type_hints", reflection)
    start = decode_client('{"type":"start","seed":5,"format":"opus","cfg_value":2}')
    assert start == Start(seed=5, format="opus", cfg_value=2.0)
    assert decode_client('{"type":"text","text":"hi"}') == Text("hi")


@pytest.mark.alone  # the others' pace is timed
@pytest.mark.slow
@pytest.mark.asyncio
@pytest.mark.parametrize("budget", [200.0, ServerConfig().limits.max_messages_per_s])
async def test_a_flooding_connection_is_closed_and_others_keep_their_pace(
    serve, aiohttp_client, connect, budget: float
) -> None:
    """The probe's flood: 2,000 ``start`` messages a second on one connection while another one speaks."""
    service = step_service(3.0)
    app = clip_app(service, max_messages_per_s=budget)
    app.router.add_get("/health", health)
    server = await serve(app=app)
    client = await aiohttp_client(server)
    speaker = await connect(server)
    await speaker.send(Start(format="pcm_f32le"))
    await speaker.receive()
    await speaker.send(Text("A long sentence to speak."))
    await speaker.send(End())

    async def listen() -> list[float]:
        arrivals = []
        while True:
            received = await speaker.receive()
            if isinstance(received, AudioFrame):
                arrivals.append(time.monotonic())
            elif isinstance(received, Done):
                return arrivals

    listening = asyncio.create_task(listen())
    await asyncio.sleep(3 * STEP_S)  # the utterance is under way
    flooder = await connect(server)
    flood = asyncio.create_task(send_flood(flooder.ws, count=5000, per_second=2000))
    answers = asyncio.create_task(answers_until_closed(flooder))  # read as it comes: an abort drops unread data
    health_s = []
    while not answers.done():
        started = time.monotonic()
        async with client.get("/health") as response:
            assert response.status == 200
        health_s.append(time.monotonic() - started)
        await asyncio.sleep(0.02)
    answered, code, reason = await answers
    flood.cancel()
    arrivals = await listening

    assert code == CloseCode.RATE_LIMITED and reason.startswith("rate_limited"), (code, reason)
    # The burst (one second's worth) plus what refills while it is spent (2,000/s against the budget), not the flood.
    assert answered <= budget * 2000 / (2000 - budget) * 1.1
    gaps = np.diff(arrivals)
    assert gaps.max() < 2 * STEP_S, f"chunk gaps up to {gaps.max():.3f} s with a {STEP_S} s step"
    assert max(health_s) < 0.1, f"/health took up to {max(health_s):.3f} s"


async def send_flood(ws, *, count: int, per_second: float) -> None:
    """Send ``count`` start messages at ``per_second`` (until the connection breaks)."""
    message = encode(Start(seed=1))
    began = time.monotonic()
    for sent in range(count):
        try:
            await ws.send_str(message)
        except ConnectionError:
            return
        if (delay := began + (sent + 1) / per_second - time.monotonic()) > 0.001:
            await asyncio.sleep(delay)


async def answers_until_closed(stream) -> tuple[int, int | None, str]:
    """How many ``ready`` answers came before the server closed, and its close code and reason."""
    answered = 0
    while True:
        message = await stream.ws.receive(timeout=10.0)
        if message.type is WSMsgType.TEXT:
            answered += 1
        elif message.type is WSMsgType.CLOSE:
            return answered - 1, message.data, str(message.extra or "")  # less the ready on connect
        elif message.type in (WSMsgType.CLOSED, WSMsgType.CLOSING, WSMsgType.ERROR):
            return answered - 1, stream.ws.close_code, str(message.extra or "")


@pytest.mark.asyncio
async def test_the_budget_refills_for_a_steady_client(serve, connect) -> None:
    server = await serve(app=clip_app(step_service(0.2), max_messages_per_s=50.0))
    stream = await connect(server)
    for _ in range(3):  # 3 bursts of 40 (within the burst of 50), each after a refill
        for _ in range(40):
            await stream.send(Start(seed=1))
        for _ in range(40):
            await stream.expect(protocol.Ready)
        await asyncio.sleep(1.0)
    assert not stream.ws.closed


# ---- D7: a connection's queued utterances are bounded -----------------------------------------------------


@pytest.mark.slow
@pytest.mark.asyncio
async def test_queued_utterances_per_connection_are_capped(serve, connect) -> None:
    server = await serve(app=clip_app(step_service(), max_queued_utterances=2))
    stream = await connect(server)
    for n in range(2):
        await stream.send(Text(f"Utterance {n}."))
        await stream.send(End())
    await stream.send(Text("One too many."))
    error = await next_error(stream)
    assert error.code == "too_many_utterances", error
    for _ in range(2):
        assert (await stream.heard()).done.finish_reason == "stop"
    await stream.send(Text("Room again."))  # once one is done, a new one is accepted
    await stream.send(End())
    assert (await stream.heard()).done.finish_reason == "stop"


async def next_error(stream) -> Error:
    while not isinstance(received := await stream.receive(), Error):
        pass
    return received


# ---- D12: close reasons and masking ----------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_text_frame_that_is_not_utf8_closes_1007_with_its_reason(serve, connect) -> None:
    stream = await connect(await serve(app=clip_app(step_service(0.2))))
    await stream.ws.send_frame(b"\xff\xfe not utf-8", WSMsgType.TEXT)
    code, reason = await stream.closed(timeout=5.0)
    assert code == CloseCode.INVALID_DATA and reason.startswith("invalid_json:"), (code, reason)


@pytest.mark.asyncio
async def test_a_message_far_too_large_closes_1009_with_its_reason(serve, connect) -> None:
    stream = await connect(await serve(app=clip_app(step_service(0.2), max_message_bytes=1024)))
    await stream.send(encode(Text("x" * 5000)))
    code, reason = await stream.closed(timeout=5.0)
    assert code == CloseCode.MESSAGE_TOO_BIG and reason.startswith("message_too_large:"), (code, reason)


@pytest.mark.asyncio
async def test_unmasked_client_frames_are_refused_with_1002(serve) -> None:
    server = await serve(app=clip_app(step_service(0.2)))
    reader, writer = await asyncio.open_connection(server.host, server.port)
    key = base64.b64encode(os.urandom(16)).decode()
    writer.write(
        f"GET {STREAM_PATH} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 101")
    writer.write(masked_text_frame(encode(Start(seed=1))))  # a proper frame first: answered
    payload = encode(Start(seed=2)).encode()
    writer.write(b"\x81" + struct.pack("!B", len(payload)) + payload)  # then an unmasked one
    await writer.drain()
    frames = await asyncio.wait_for(server_frames(reader), 5.0)
    assert [opcode for opcode, _ in frames] == [0x1, 0x1, 0x8]  # ready on connect, ready for seed 1, close
    close = frames[-1][1]
    assert struct.unpack("!H", close[:2])[0] == CloseCode.PROTOCOL_ERROR
    assert close[2:].decode().startswith("protocol_error:")
    assert b'"seed":2' not in frames[1][1]
    writer.close()


async def server_frames(reader: asyncio.StreamReader) -> list[tuple[int, bytes]]:
    """The server's (unmasked) frames, up to and including its close frame."""
    frames = []
    while True:
        first, second = await reader.readexactly(2)
        length = second & 0x7F
        if length == 126:
            length = struct.unpack("!H", await reader.readexactly(2))[0]
        elif length == 127:
            length = struct.unpack("!Q", await reader.readexactly(8))[0]
        frames.append((first & 0x0F, await reader.readexactly(length)))
        if first & 0x0F == 0x8:
            return frames
