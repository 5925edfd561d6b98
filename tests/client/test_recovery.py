"""Clients that recover: a refused connection (HTTP 503 from a busy or draining server, or an older server's
close 1013) is tried again with backoff; a connection lost mid-utterance (1001, 1006) is reported with its own
exit code, and ``say`` speaks the text not yet sent on a new connection without playing anything twice."""

from __future__ import annotations

import asyncio
import random

import pytest
from aiohttp import WSCloseCode
from websockets.asyncio.server import ServerConnection
from websockets.asyncio.server import serve as ws_serve

from voxwire.audio.pcm import to_s16le
from voxwire.client.bench.measure import RequestKind
from voxwire.client.bench.runner import BenchConfig, run_open
from voxwire.client.connection import Connection
from voxwire.client.errors import ConnectionLostError, ServerBusyError
from voxwire.client.retry import RetryPolicy, open_with_retry
from voxwire.params import SynthesisParams
from voxwire.protocol.wire import PROTOCOL_VERSION, Error, Ready, Text, encode
from voxwire.serving.runtime.keys import SESSIONS_KEY
from voxwire.serving.ws.handler import STREAM_PATH
from voxwire.tts import VoxCPM

from .helpers import TIMEOUT_S, launch, voxwire

SEED = 11
FAST = RetryPolicy(retries=40, first_delay_s=0.02, max_delay_s=0.1)
"""Quick retries for tests (the server's ``Retry-After: 1`` is capped by ``max_delay_s``)."""


FAKE_READY = Ready(
    protocol=PROTOCOL_VERSION, model="fake", format="pcm_s16le", sample_rate=16000, chunk_s=0.16, pre_skip=0,
    voice=None, seed=None, cfg_value=2.0, inference_timesteps=10, max_buffer_delay_ms=500,
    playback_lead_ms=300, persona=None,
)  # fmt: skip


def url(server) -> str:
    return str(server.make_url("/")).replace("http://", "ws://")


async def stderr_until(process: asyncio.subprocess.Process, needle: str) -> str:
    """Read the process's stderr up to the line containing ``needle``; what was read."""
    assert process.stderr is not None
    seen = ""
    while needle not in seen:
        line = await asyncio.wait_for(process.stderr.readline(), TIMEOUT_S)
        assert line, f"stderr ended before {needle!r}: {seen}"
        seen += line.decode()
    return seen


# ---- the retry policy ------------------------------------------------------------------------------------------


def test_backoff_doubles_honours_retry_after_and_stays_capped() -> None:
    policy = RetryPolicy(first_delay_s=0.25, max_delay_s=8.0, jitter=0.5)
    rng = random.Random(0)
    for retry, base in enumerate([0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 8.0]):
        assert base <= policy.delay_s(retry, None, rng) <= base * 1.5
    assert 3.0 <= policy.delay_s(0, 3.0, rng) <= 4.5  # never sooner than the server asked
    assert policy.delay_s(0, 60.0, rng) <= 12.0  # nor longer than the cap (with its jitter)
    spread = {round(policy.delay_s(2, None, rng), 6) for _ in range(20)}
    assert len(spread) > 10, "clients refused together must not all come back together"
    with pytest.raises(ValueError):
        RetryPolicy(retries=-1)


# ---- refusals are retried ------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_connection_refused_as_busy_is_retried_until_a_place_frees(serve, aiohttp_client) -> None:
    server = await serve(max_connections=1)
    holder = await (await aiohttp_client(server)).ws_connect(STREAM_PATH)
    with pytest.raises(ServerBusyError, match=r"HTTP 503: busy.*gave up after 1 attempt"):
        await open_with_retry(url(server), None, RetryPolicy(retries=0))
    notes: list[str] = []
    waiting = asyncio.ensure_future(open_with_retry(url(server), None, FAST, log=notes.append))
    while not notes:
        await asyncio.sleep(0.01)
    assert not waiting.done()
    await holder.close()
    async with await waiting as connection:
        assert connection.ready.model
    assert "refused the connection for now (HTTP 503: busy)" in notes[0] and "retrying in" in notes[0]


@pytest.mark.slow
@pytest.mark.asyncio
async def test_say_waits_out_a_busy_server_and_gives_up_with_exit_7(serve, aiohttp_client, tiny_tts: VoxCPM) -> None:
    server = await serve(max_connections=1)
    holder = await (await aiohttp_client(server)).ws_connect(STREAM_PATH)
    gave_up = await voxwire("say", "--server", url(server), "--retries", "1", "--out", "-", "Hello.")
    assert gave_up.returncode == 7, gave_up.stderr
    assert "gave up after 2 attempt(s)" in gave_up.stderr and "HTTP 503: busy" in gave_up.stderr

    process = await launch(
        "say", "-v", "--server", url(server), "--seed", str(SEED), "--format", "pcm_s16le", "--out", "-", "Hello."
    )
    await stderr_until(process, "retrying in")
    await holder.close()
    stdout, _ = await asyncio.wait_for(process.communicate(), TIMEOUT_S)
    assert process.returncode == 0
    assert stdout == to_s16le(tiny_tts.generate("Hello.", SynthesisParams(seed=SEED)))


@pytest.mark.asyncio
async def test_an_older_servers_1013_refusal_is_retried_like_a_503() -> None:
    refusals = 2

    async def handler(ws: ServerConnection) -> None:
        nonlocal refusals
        if refusals:
            refusals -= 1
            await ws.send(encode(Error("busy", "the server has its maximum of 1 connections")))
            await ws.close(1013, "busy: the server has its maximum of 1 connections")
            return
        await ws.send(encode(FAKE_READY))
        await ws.wait_closed()

    async with ws_serve(handler, "127.0.0.1", 0) as fake:
        port = fake.sockets[0].getsockname()[1]
        async with await open_with_retry(f"ws://127.0.0.1:{port}", None, FAST) as connection:
            assert connection.ready.model == "fake"
    assert refusals == 0


# ---- lost connections are reported ---------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_connection_broken_without_a_close_frame_is_a_lost_connection() -> None:
    async def handler(ws: ServerConnection) -> None:
        await ws.send(encode(FAKE_READY))
        await ws.recv()
        ws.transport.abort()  # what a killed replica looks like from the client: no close frame

    async with ws_serve(handler, "127.0.0.1", 0) as fake:
        port = fake.sockets[0].getsockname()[1]
        async with await Connection.open(f"ws://127.0.0.1:{port}") as connection:
            await connection.send(Text("Hello."))
            with pytest.raises(ConnectionLostError) as lost:
                await connection.receive()
    assert (lost.value.code, lost.value.close_code, lost.value.exit_code) == ("connection_lost", 1006, 6)


@pytest.mark.slow
@pytest.mark.asyncio
async def test_say_reports_a_lost_connection_and_speaks_the_rest_without_replaying(serve, tiny_tts: VoxCPM) -> None:
    server = await serve()
    first, second = "The first line is here.", "The second line follows it."
    expected_first = to_s16le(tiny_tts.generate(first, SynthesisParams(seed=SEED)))
    process = await launch(
        "say", "-v", "--server", url(server), "--seed", str(SEED), "--format", "pcm_s16le", "--out", "-", "-"
    )
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write(f"{first}\n".encode())
    await process.stdin.drain()
    heard = await asyncio.wait_for(process.stdout.readexactly(len(expected_first)), TIMEOUT_S)
    # The utterance is still open (no end yet: standard input is open) when the server goes away.
    for ws in list(server.app[SESSIONS_KEY]):
        await ws.close(code=WSCloseCode.GOING_AWAY, message=b"server shutting down")
    log = await stderr_until(process, "connection lost")
    assert "connection lost during utterance 1 (going_away, close code 1001)" in log
    await stderr_until(process, "connected")  # a new connection, waiting for the text still to come
    process.stdin.write(f"{second}\n".encode())
    process.stdin.close()
    rest, stderr = await asyncio.wait_for(process.communicate(), TIMEOUT_S)
    assert process.returncode == 6, stderr.decode()
    assert "1 connection(s) lost mid-utterance" in stderr.decode()
    # The first line's audio once, then the second line's, spoken alone as the new connection's first utterance.
    assert heard == expected_first
    assert rest == to_s16le(tiny_tts.generate(second, SynthesisParams(seed=SEED)))


# ---- bench ---------------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.alone  # its retries last a few seconds
@pytest.mark.asyncio
async def test_bench_visitors_refused_at_the_connection_limit_retry_and_all_succeed(serve) -> None:
    server = await serve(max_connections=1)
    config = BenchConfig(
        server=url(server), texts=("Short one.",), duration_s=1.0, progress=False, format="pcm_s16le", retry=FAST
    )
    result = await run_open(config, rate=6.0, rng_seed=1)
    assert len(result.records) >= 3
    assert [record.error for record in result.records] == [None] * len(result.records)
    assert result.peak_in_flight[RequestKind.WEBSOCKET] >= 2, "arrivals never overlapped: nothing was refused"
