"""``voxwire serve --workers 2``: one engine process, two frontends on one port, behaving as one server."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import urllib.request
from collections.abc import Iterator

import numpy as np
import pytest
from tests.server_process import ServerProcess, poll, server_threads

from voxwire.client.connection import Connection
from voxwire.client.errors import AuthenticationError, ServerError
from voxwire.params import SynthesisParams
from voxwire.protocol.wire import AudioFrame, Cancel, Done, End, Start, Text
from voxwire.tts import VoxCPM

from .helpers import KEY, LONG, TEXT, frontend_pids, metric, speak, upload_voice

pytestmark = pytest.mark.slow

TEXTS = ["The first voice.", "A second, longer sentence follows here.", "Third.", "And the fourth one ends it."]


@pytest.fixture(scope="module")
def server(tiny_tts: VoxCPM) -> Iterator[ServerProcess]:
    args = ("--model", tiny_tts.name, "--workers", "2", "--max-sessions", "8", "--encoder-threads", "1")
    with ServerProcess(*args, env={"VOXWIRE_API_KEYS": KEY}) as process:
        process.wait_ready()
        yield process


def sim_server(*extra: str) -> ServerProcess:
    """A sim-model server whose utterances last seconds (a 60 ms step per 160 ms chunk), once both frontends
    listen: ``/ready`` answers as soon as one does, and a test that needs sessions on both would otherwise find
    every connection on the first (the kernel hands them only to sockets already listening)."""
    process = ServerProcess("--model", "sim", "--sim-cost", "60ms", "--workers", "2", *extra)
    process.wait_ready()
    assert poll(lambda: len(listening_frontends(process)) == 2, timeout=60), process.log
    return process


def listening_frontends(process: ServerProcess) -> set[str]:
    return set(re.findall(r"\[frontend-(\d+)\]: listening on", process.log))


# ---- one shared server: behaviour is the single-process server's -----------------------------------------------


@pytest.mark.isa
def test_pcm_is_generate_alone_and_the_same_in_a_crowd(server: ServerProcess, tiny_tts: VoxCPM) -> None:
    pcm, done = asyncio.run(speak(server.ws_url, TEXT, seed=11))
    assert done.finish_reason in ("stop", "length")
    with server_threads():
        expected = tiny_tts.generate(TEXT, SynthesisParams(seed=11))
    np.testing.assert_array_equal(np.frombuffer(pcm, "<f4"), expected)

    async def crowd() -> list[tuple[bytes, Done]]:
        # Separate connections: the kernel spreads them over both frontends, all batched by the one engine.
        return await asyncio.gather(*(speak(server.ws_url, text, seed=i) for i, text in enumerate(TEXTS)))

    for i, (text, (pcm, _)) in enumerate(zip(TEXTS, asyncio.run(crowd()), strict=True)):
        np.testing.assert_allclose(
            np.frombuffer(pcm, "<f4"), tiny_tts.generate(text, SynthesisParams(seed=i)), atol=1e-4, rtol=0
        )


def test_every_endpoint_but_the_probes_needs_the_key(server: ServerProcess) -> None:
    assert server.status("/ready") == 200
    assert server.status("/metrics") == 401
    assert server.status("/metrics", KEY) == 200
    with pytest.raises(AuthenticationError):
        asyncio.run(speak(server.ws_url, TEXT, seed=1, token=None))


def test_a_voice_saved_through_one_frontend_is_known_to_every_frontend(server: ServerProcess) -> None:
    clip = np.sin(np.linspace(0, 400 * np.pi, 48000)).astype(np.float32) * 0.3
    voice = upload_voice(server, clip)
    # Fresh connections land on either frontend; each must list the voice and speak with it.
    for _ in range(8):
        assert voice in {v["id"] for v in json.loads(server.get("/v1/voices", KEY))["data"]}
    for seed in range(4):

        async def in_voice(seed: int = seed) -> Done:
            async with await Connection.open(server.ws_url, KEY) as connection:
                await connection.configure(Start(format="pcm_f32le", seed=seed, voice=voice))
                await connection.send(Text(TEXT))
                await connection.send(End())
                while not isinstance(message := await asyncio.wait_for(connection.receive(), 60), Done):
                    pass
                return message

        assert asyncio.run(in_voice()).finish_reason in ("stop", "length")
    request = urllib.request.Request(f"{server.url}/v1/voices/{voice}", method="DELETE")
    request.add_header("Authorization", f"Bearer {KEY}")
    urllib.request.urlopen(request, timeout=10).close()
    for _ in range(8):
        assert voice not in {v["id"] for v in json.loads(server.get("/v1/voices", KEY))["data"]}


def test_metrics_are_one_view_of_every_frontend(server: ServerProcess) -> None:
    name = 'voxwire_utterances_total{finish_reason="stop"}'
    names = (name, 'voxwire_utterances_total{finish_reason="length"}')
    before = sum(metric(server.get("/metrics", KEY), n) for n in names)

    async def several() -> None:
        await asyncio.gather(*(speak(server.ws_url, text, seed=i) for i, text in enumerate(TEXTS * 2)))

    asyncio.run(several())
    # Whichever frontend answers the scrape counts the utterances of both.
    for _ in range(6):
        scraped = server.get("/metrics", KEY)
        assert sum(metric(scraped, n) for n in names) == before + 2 * len(TEXTS)
        assert metric(scraped, "voxwire_engine_step_seconds_count") > 0


def test_cancel_ends_the_utterance_and_frees_its_slot(server: ServerProcess) -> None:
    async def cancel() -> Done:
        async with await Connection.open(server.ws_url, KEY) as connection:
            await connection.configure(Start(format="opus", seed=3))
            await connection.send(Text(" ".join([TEXT] * 20)))
            await connection.send(End())
            while not isinstance(await asyncio.wait_for(connection.receive(), 60), AudioFrame):
                pass
            await connection.send(Cancel())
            while not isinstance(message := await asyncio.wait_for(connection.receive(), 60), Done):
                pass
            return message

    assert asyncio.run(cancel()).finish_reason == "cancelled"
    assert poll(lambda: metric(server.get("/metrics", KEY), "voxwire_engine_requests_running") == 0, timeout=10)


# ---- processes coming and going ---------------------------------------------------------------------------------


def test_killing_a_frontend_ends_only_its_sessions_and_it_comes_back() -> None:
    with sim_server() as server:
        old = frontend_pids(server)
        assert len(old) == 2

        async def started(seed: int) -> Connection:
            connection = await Connection.open(server.ws_url)
            await connection.configure(Start(format="opus", seed=seed))
            await connection.send(Text(LONG))
            await connection.send(End())
            while not isinstance(await asyncio.wait_for(connection.receive(), 60), AudioFrame):
                pass
            return connection

        async def outcome(connection: Connection) -> str:
            try:
                while not isinstance(message := await asyncio.wait_for(connection.receive(), 60), Done):
                    pass
                return message.finish_reason
            except (ServerError, OSError, asyncio.TimeoutError):
                return "lost"
            finally:
                await connection.close()

        async def many() -> list[str]:
            # Every session is mid-utterance, on one frontend or the other, when frontend 0 is killed.
            connections = await asyncio.gather(*(started(seed) for seed in range(12)))
            os.kill(old[0], signal.SIGKILL)
            return await asyncio.gather(*(outcome(connection) for connection in connections))

        outcomes = asyncio.run(many())
        assert "lost" in outcomes and outcomes.count("stop") + outcomes.count("length") >= 1, outcomes
        assert set(outcomes) <= {"lost", "stop", "length"}, outcomes
        assert poll(lambda: frontend_pids(server).get(0, old[0]) != old[0], timeout=30), server.log
        # Served again, by whichever frontend: the restarted one or the one that never stopped.
        for seed in range(4):
            assert asyncio.run(speak(server.ws_url, TEXT, seed=seed, token=None))[1].finish_reason in ("stop", "length")
        # The process metrics follow the successor: frontend-0 is now a process started after frontend-1.
        scraped = server.get("/metrics")
        started_at = {
            name: metric(scraped, f'process_start_time_seconds{{process="{name}"}}')
            for name in ("supervisor", "engine-0", "frontend-0", "frontend-1")
        }
        assert started_at["frontend-0"] > started_at["frontend-1"] >= started_at["supervisor"] > 0, started_at
        assert server.stop() == 0


def test_sigterm_drains_live_utterances_then_closes_with_1001() -> None:
    with sim_server() as server:

        async def live() -> tuple[str, int | None]:
            async with await Connection.open(server.ws_url) as connection:
                await connection.configure(Start(format="opus", seed=1))
                await connection.send(Text(LONG))
                await connection.send(End())
                while not isinstance(await asyncio.wait_for(connection.receive(), 60), AudioFrame):
                    pass
                server.process.send_signal(signal.SIGTERM)
                while not isinstance(message := await asyncio.wait_for(connection.receive(), 60), Done):
                    pass
                with contextlib.suppress(ServerError):
                    await asyncio.wait_for(connection.receive(), 30)
                return message.finish_reason, connection.ws.close_code

        reason, close_code = asyncio.run(live())
        assert server.process.wait(timeout=60) == 0, server.log
    assert reason in ("stop", "length")  # the utterance was not cut
    assert close_code == 1001
