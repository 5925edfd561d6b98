"""Refusals and limits: every bad input gets its own error code and leaves the connection usable (and other
sessions untouched); connection and engine capacity, readiness, idle time, pings, a client that stops reading,
and 64 sessions at once."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import numpy as np
import pytest
from aiohttp import ClientSession, WSMsgType, WSServerHandshakeError
from aiohttp.test_utils import TestServer

from voxwire.protocol.wire import CloseCode, Done, End, Ready, Segment, Start, Text, encode
from voxwire.serving.app import drain
from voxwire.serving.runtime.keys import CONFIG_KEY, METRICS_KEY, SESSIONS_KEY, STATE_KEY, Phase
from voxwire.serving.ws.handler import STREAM_PATH

from .conftest import Connect, StreamClient, engine_idle, until
from .helpers import UPGRADE, masked_text_frame, stalled_client

pytestmark = pytest.mark.asyncio

LIMITS = {"max_message_bytes": 1024, "max_text_chars_per_message": 100, "max_text_chars_per_utterance": 150}

BAD_INPUTS = [
    ("malformed JSON", "{not json", "invalid_json"),
    ("not an object", "[1, 2]", "invalid_message"),
    ("unknown type", '{"type":"speak","text":"hi"}', "unknown_type"),
    ("unknown field", '{"type":"flush","now":true}', "unknown_field"),
    ("wrong field type", '{"type":"text","text":5}', "invalid_field"),
    ("missing field", '{"type":"text"}', "invalid_field"),
    ("out of range for the protocol", '{"type":"start","seed":-5}', "out_of_range"),
    ("cfg_value past the server's limit", '{"type":"start","cfg_value":50}', "out_of_range"),
    ("more timesteps than the server allows", '{"type":"start","inference_timesteps":500}', "out_of_range"),
    ("unknown format", '{"type":"start","format":"mp3"}', "out_of_range"),
    ("unknown voice", '{"type":"start","voice":"voice_0000000000000000"}', "unknown_voice"),
    ("a voice id that names a path", '{"type":"start","voice":"../../etc/passwd"}', "unknown_voice"),
    ("end with no text", '{"type":"end"}', "empty_utterance"),
    ("a text over the per-message limit", encode(Text("x" * 101)), "text_too_long"),
    ("a message over max_message_bytes", encode(Text("é" * 600)), "message_too_large"),
]


async def still_usable(stream: StreamClient) -> None:
    await stream.send(Start())
    await stream.expect(Ready)


@pytest.mark.parametrize(("raw", "code"), [pytest.param(raw, code, id=name) for name, raw, code in BAD_INPUTS])
async def test_each_bad_input_gets_its_code_and_the_connection_stays_usable(
    ws_server: Callable, connect: Connect, raw: str, code: str
) -> None:
    stream = await connect(await ws_server(**LIMITS))
    await stream.send(raw)
    error = await stream.error(code)
    assert error.utterance is None and error.message
    await still_usable(stream)


async def test_binary_frames_and_misplaced_messages_are_refused(ws_server: Callable, connect: Connect) -> None:
    stream = await connect(await ws_server(**LIMITS))
    await stream.ws.send_bytes(b"\x01\x02\x03")
    await stream.error("binary_frame")
    await stream.send(Start(max_buffer_delay_ms=60_000))
    await stream.expect(Ready)
    await stream.send(Text("An utterance that is still open "))
    await stream.send(Start(seed=1))
    await stream.error("utterance_in_progress")
    await stream.send(Text("x" * 100))
    await stream.send(Text("x" * 100))
    await stream.error("utterance_too_long")
    await stream.send(End())  # what was accepted (132 characters) is spoken
    heard = await stream.heard()
    assert heard.done is not None and heard.done.finish_reason in ("stop", "length") and not heard.errors


async def test_a_message_far_over_the_limit_closes_the_connection_unread(ws_server: Callable, connect: Connect) -> None:
    stream = await connect(await ws_server(**LIMITS))
    await stream.send(encode(Text("x" * 5000)))  # over 4 x max_message_bytes
    code, _ = await stream.closed()
    assert code == CloseCode.MESSAGE_TOO_BIG


@pytest.mark.isa
async def test_bad_input_on_one_connection_is_not_noticed_by_another(ws_server: Callable, connect: Connect) -> None:
    server = await ws_server(**LIMITS)
    alone = await connect(server)
    await alone.send(Start(format="pcm_f32le", seed=9))
    await alone.expect(Ready)

    async def speak(stream: StreamClient) -> np.ndarray:
        await stream.send(Text("The bystander speaks."))
        await stream.send(End())
        heard = await stream.heard()
        assert not heard.errors and heard.done is not None
        return heard.pcm()

    expected = await speak(alone)
    bystander = await connect(server)
    await bystander.send(Start(format="pcm_f32le", seed=9))
    await bystander.expect(Ready)
    vandal = await connect(server)

    async def vandalise() -> None:
        for _, raw, code in BAD_INPUTS:
            await vandal.send(raw)
            await vandal.error(code)

    heard, _ = await asyncio.gather(speak(bystander), vandalise())
    np.testing.assert_array_equal(heard, expected)


async def test_connections_past_the_limit_are_refused_with_503_before_the_upgrade(
    ws_server: Callable, connect: Connect
) -> None:
    server = await ws_server(max_connections=2)
    await connect(server)
    second = await connect(server)
    await refused_upgrade(connect, server, "busy")
    await second.ws.close()
    await until(lambda: len(server.app[SESSIONS_KEY]) == 1)
    await connect(server)  # a freed place is taken again


async def test_no_new_connection_or_utterance_while_the_server_is_not_ready(
    ws_server: Callable, connect: Connect
) -> None:
    server = await ws_server()
    early = await connect(server)
    server.app[STATE_KEY].phase = Phase.DRAINING
    await refused_upgrade(connect, server, "shutting_down")
    await early.send(Text("A new utterance."))
    await early.error("unavailable")
    server.app[STATE_KEY].phase = Phase.STARTING
    await refused_upgrade(connect, server, "not_ready")
    server.app[STATE_KEY].phase = Phase.READY


async def refused_upgrade(connect: Connect, server: TestServer, code: str) -> None:
    """The upgrade is answered 503 with Retry-After and the error envelope: no 101, so a balancer may retry."""
    with pytest.raises(WSServerHandshakeError) as refused:
        await connect(server, read_ready=False)
    assert refused.value.status == 503
    assert refused.value.headers is not None and refused.value.headers["Retry-After"] == "1"
    assert refused.value.headers["X-Voxwire-Replica"] == server.app[CONFIG_KEY].transport.replica_id
    async with ClientSession() as http, http.get(server.make_url(STREAM_PATH), headers=UPGRADE) as response:
        assert response.status == 503
        assert (await response.json())["error"]["code"] == code


async def test_shutdown_lets_a_live_utterance_finish_then_closes_with_1001(
    ws_server: Callable, connect: Connect
) -> None:
    server = await ws_server()
    stream = await connect(server)
    await stream.send(Text("One sentence is here. Another one follows it."))
    await stream.send(End())
    await stream.expect(Segment)
    draining = asyncio.create_task(drain(server.app))
    heard = await stream.heard()
    assert heard.done is not None and heard.done.finish_reason in ("stop", "length") and len(heard.segments) == 1
    assert (await stream.closed())[0] == CloseCode.GOING_AWAY
    await draining


async def test_a_client_that_leaves_mid_utterance_frees_everything(ws_server: Callable, connect: Connect) -> None:
    server = await ws_server()
    stream = await connect(server)
    await stream.send(Text(" ".join(f"Sentence {n} is long enough." for n in range(20))))
    await stream.expect(Segment)
    await stream.ws.close()
    await engine_idle(server.app, timeout=5.0)
    app = server.app
    await until(lambda: not app[SESSIONS_KEY] and app[STATE_KEY].live_utterances == 0)
    assert 'voxwire_dropped_sessions_total{reason="client_gone"} 1.0' in app[METRICS_KEY].exposition().decode()


async def test_a_full_engine_queue_fails_the_utterance_with_busy(ws_server: Callable, connect: Connect) -> None:
    server = await ws_server(max_sessions=1, max_waiting=1)
    streams = [await connect(server) for _ in range(6)]
    for stream in streams:
        await stream.send(Text("Everyone speaks at once."))
        await stream.send(End())
    outcomes = await asyncio.gather(*(stream.heard() for stream in streams))
    busy = [heard for heard in outcomes if heard.done and heard.done.finish_reason == "error"]
    assert busy, "six requests fitted into one slot and a one-place queue"
    for heard in busy:
        assert [(e.code, e.utterance) for e in heard.errors] == [("busy", 0)]
    await engine_idle(server.app)
    await still_usable(streams[0])


async def test_an_idle_connection_is_closed(ws_server: Callable, connect: Connect) -> None:
    stream = await connect(await ws_server(idle_timeout_s=0.3))
    code, reason = await stream.closed(timeout=5.0)
    assert code == CloseCode.IDLE_TIMEOUT and reason.startswith("idle_timeout")


async def test_the_server_pings(ws_server: Callable, connect: Connect) -> None:
    stream = await connect(await ws_server(ping_interval_s=0.2), autoping=False)
    message = await stream.ws.receive(timeout=5.0)
    assert message.type is WSMsgType.PING


# ---- a client that stops reading -------------------------------------------------------------------------------


@pytest.mark.slow
async def test_a_client_that_stops_reading_is_cut_off(ws_server: Callable, connect: Connect) -> None:
    server = await ws_server(max_unsent_audio_s=0.5)
    sock = await stalled_client(server.host, server.port)
    loop = asyncio.get_running_loop()
    text = " ".join(f"Sentence number {n} goes on." for n in range(40))
    for message in (Start(format="pcm_f32le"), Text(text), End()):
        await loop.sock_sendall(sock, masked_text_frame(encode(message)))

    metrics = server.app[METRICS_KEY]
    dropped = 'voxwire_dropped_sessions_total{reason="slow_consumer"} 1.0'
    for _ in range(600):
        if dropped in metrics.exposition().decode():
            break
        await asyncio.sleep(0.05)
    else:
        pytest.fail("the stalled client was not cut off within 30 s")
    await engine_idle(server.app, timeout=5.0)
    assert server.app[STATE_KEY].live_utterances == 0

    async def drain() -> None:  # the server has closed or cut the TCP connection
        try:
            while await loop.sock_recv(sock, 65536):
                pass
        except ConnectionResetError:
            pass

    await asyncio.wait_for(drain(), 10.0)
    sock.close()
    fresh = await connect(server)
    await fresh.send(Text("Next, please."))
    await fresh.send(End())
    assert (await fresh.heard()).done is not None


@pytest.mark.slow
async def test_64_sessions_at_once_all_finish(ws_server: Callable, connect: Connect) -> None:
    server = await ws_server(max_sessions=16, max_waiting=64)
    streams = [await connect(server) for _ in range(64)]

    async def speak(number: int, stream: StreamClient) -> Done:
        await stream.send(Text(f"Hello number {number}."))
        await stream.send(End())
        heard = await stream.heard()
        assert not heard.errors and heard.frames and heard.done is not None
        return heard.done

    dones = await asyncio.gather(*(speak(n, stream) for n, stream in enumerate(streams)))
    assert {done.finish_reason for done in dones} <= {"stop", "length"}
    assert all(done.audio_s > 0 and done.ttfa_s is not None for done in dones)
    await engine_idle(server.app)
    assert server.app[STATE_KEY].live_utterances == 0
