"""``voxwire serve --devices cpu,cpu``: two engine processes behind one frontend, utterances routed by load."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import numpy as np
import pytest
from tests.server_process import ServerProcess, poll
from tests.workers.helpers import KEY, frontend_pids, metric, speak, upload_voice, utterance

from voxwire.client.connection import Connection
from voxwire.protocol.wire import AudioFrame, Done, End, Error, Start, Text

pytestmark = pytest.mark.slow

SENTENCE = "Each of these sentences keeps a simulated engine busy for a little while."
TEXTS = [f"{SENTENCE} Number {i} ends here." for i in range(8)]
LONG = " ".join([SENTENCE] * 4)


def sim_devices(*extra: str) -> ServerProcess:
    # A 60 ms step per 160 ms chunk: utterances last seconds, long enough to see both engines at work.
    flags = ("--model", "sim", "--sim-cost", "60ms", "--devices", "cpu,cpu", "--workers", "1")
    return ServerProcess(*flags, *extra, env={"VOXWIRE_API_KEYS": KEY})


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with sim_devices("--max-sessions", "8") as process:
        process.wait_ready()
        yield process


def test_every_engine_is_warmed_up_before_ready(server: ServerProcess) -> None:
    scraped = server.get("/metrics", KEY)
    for engine in ("0", "1"):
        assert metric(scraped, f'voxwire_engine_step_seconds_count{{engine="{engine}"}}') > 0, scraped


def active(server: ServerProcess) -> tuple[float, float]:
    """Utterances running on engine 0 and on engine 1 now."""
    scraped = server.get("/metrics", KEY)
    return tuple(metric(scraped, f'voxwire_engine_requests_running{{engine="{i}"}}') for i in range(2))  # type: ignore[return-value]


async def watch_engines(server: ServerProcess, samples: list[tuple[float, float]], stop: asyncio.Event) -> None:
    while not stop.is_set():
        samples.append(await asyncio.to_thread(active, server))
        await asyncio.sleep(0.05)


@pytest.mark.isa
def test_sessions_spread_over_both_engines_each_equal_to_its_solo_run(server: ServerProcess) -> None:
    solo = [asyncio.run(speak(server.ws_url, text, seed=i))[0] for i, text in enumerate(TEXTS)]

    async def crowd() -> tuple[list[tuple[bytes, Done]], list[tuple[float, float]]]:
        samples: list[tuple[float, float]] = []
        stop = asyncio.Event()
        watcher = asyncio.create_task(watch_engines(server, samples, stop))
        results = await asyncio.gather(*(speak(server.ws_url, text, seed=i) for i, text in enumerate(TEXTS)))
        stop.set()
        await watcher
        return results, samples

    results, samples = asyncio.run(crowd())
    for alone, (pcm, done) in zip(solo, results, strict=True):
        assert done.finish_reason in ("stop", "length")
        np.testing.assert_array_equal(np.frombuffer(pcm, "<f4"), np.frombuffer(alone, "<f4"))
    # Both engines ran utterances at the same time, half of the crowd each at the peak.
    assert max(min(first, second) for first, second in samples) >= 3, samples
    assert max(first + second for first, second in samples) <= len(TEXTS)


def test_a_connections_next_utterance_stays_on_its_engine(server: ServerProcess) -> None:
    assert poll(lambda: active(server) == (0, 0), timeout=10)

    async def scenario() -> list[tuple[float, float]]:
        async with (
            await Connection.open(server.ws_url, KEY) as first,
            await Connection.open(server.ws_url, KEY) as other,
        ):
            await utterance(first, "A short first utterance.", seed=1)  # idle engines: engine 0 takes it
            # The other connection's long utterance also goes to engine 0 (both idle, the lower index first) ...
            await other.configure(Start(format="pcm_f32le", seed=2))
            await other.send(Text(LONG))
            await other.send(End())
            while not isinstance(await asyncio.wait_for(other.receive(), 30), AudioFrame):
                pass
            # ... so engine 1 is the freer one, but the first connection's next utterance stays on engine 0.
            samples: list[tuple[float, float]] = []
            stop = asyncio.Event()
            watcher = asyncio.create_task(watch_engines(server, samples, stop))
            _, done = await utterance(first, LONG, seed=3)
            stop.set()
            await watcher
            assert done.finish_reason in ("stop", "length")
            while not isinstance(await asyncio.wait_for(other.receive(), 60), Done):
                pass
            return samples

    samples = asyncio.run(scenario())
    assert max(second for _, second in samples) == 0, samples
    assert max(first for first, _ in samples) == 2, samples


def test_a_voice_saved_once_speaks_on_both_engines(server: ServerProcess) -> None:
    clip = np.sin(np.linspace(0, 400 * np.pi, 48000)).astype(np.float32) * 0.3
    voice = upload_voice(server, clip)

    async def both() -> tuple[list[Done], list[tuple[float, float]]]:
        samples: list[tuple[float, float]] = []
        stop = asyncio.Event()
        watcher = asyncio.create_task(watch_engines(server, samples, stop))
        done = await asyncio.gather(*(in_voice(server, voice, seed) for seed in range(4)))
        stop.set()
        await watcher
        return done, samples

    done, samples = asyncio.run(both())
    assert all(d.finish_reason in ("stop", "length") for d in done)
    assert max(min(first, second) for first, second in samples) >= 1, samples


def test_ready_waits_for_every_engine() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "voxwire.cli.main", "serve", "--model", "sim", "--devices", "cpu,cpu"]
    command += ["--workers", "1"]  # one frontend, whatever the machine's cores
    process = subprocess.Popen(
        [*command, "--port", str(port)], stderr=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    lines: list[str] = []
    stopped = threading.Event()
    engine_1: list[int] = []

    def read() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            lines.append(line)
            found = re.search(r"engine 1 started on cpu \(pid (\d+)\)", line)
            if found:  # before it has even imported torch: it cannot have welcomed the frontend yet
                engine_1.append(int(found.group(1)))
                os.kill(engine_1[0], signal.SIGSTOP)
                stopped.set()

    def ready() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=2) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False

    threading.Thread(target=read, daemon=True).start()
    try:
        assert stopped.wait(30), "".join(lines)
        assert poll(lambda: "engine process 0 serving" in "".join(lines), timeout=60), "".join(lines)
        assert not poll(ready, timeout=3), "ready while engine 1 was not"
        os.kill(engine_1[0], signal.SIGCONT)
        assert poll(ready, timeout=60), "".join(lines)
    finally:
        for pid in engine_1:  # a stopped engine could not see its supervisor go
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        process.kill()
        process.wait(timeout=30)


# ---- one engine's death (issue 20, item 10) ---------------------------------------------------------------------


def engine_pid(server: ServerProcess, index: int) -> int:
    """The pid of engine ``index``'s latest process, from the supervisor's log."""
    return int(re.findall(rf"engine {index} started on .* \(pid (\d+)\)", server.log)[-1])


async def started(url: str, text: str, seed: int) -> tuple[Connection, bytes]:
    """A connection mid-utterance, and its first audio."""
    connection = await Connection.open(url, KEY)
    await connection.configure(Start(format="pcm_f32le", seed=seed))
    await connection.send(Text(text))
    await connection.send(End())
    while not isinstance(message := await asyncio.wait_for(connection.receive(), 60), AudioFrame):
        pass
    return connection, b"".join(message.packets)


async def rest(connection: Connection) -> tuple[bytes, str]:
    """The rest of a live utterance: its audio and how it ended (an error's code, else the finish reason)."""
    audio, error = [], None
    while not isinstance(message := await asyncio.wait_for(connection.receive(), 60), Done):
        if isinstance(message, AudioFrame):
            audio += message.packets
        elif isinstance(message, Error):
            error = message.code
    return b"".join(audio), error or message.finish_reason


async def in_voice(server: ServerProcess, voice: str, seed: int) -> Done:
    async with await Connection.open(server.ws_url, KEY) as connection:
        await connection.configure(Start(format="pcm_f32le", seed=seed, voice=voice))
        await connection.send(Text(LONG))
        await connection.send(End())
        while not isinstance(message := await asyncio.wait_for(connection.receive(), 60), Done):
            pass
        return message


def voices(server: ServerProcess) -> set[str]:
    return {voice["id"] for voice in json.loads(server.get("/v1/voices", KEY))["data"] if not voice["builtin"]}


@pytest.mark.isa
def test_one_engines_death_ends_only_its_sessions_and_its_successor_rejoins() -> None:
    with sim_devices("--max-sessions", "8", "--workers", "2") as server:
        server.wait_ready()
        clip = np.sin(np.linspace(0, 400 * np.pi, 48000)).astype(np.float32) * 0.3
        voice = upload_voice(server, clip)  # kept by engine 0, the hub: the engine to die
        solo = asyncio.run(speak(server.ws_url, LONG, seed=2))[0]
        readiness: list[int | None] = []
        probing = threading.Event()

        def probe() -> None:
            while not probing.is_set():
                readiness.append(server.status("/ready"))
                time.sleep(0.05)

        async def scenario() -> tuple[str, bytes, str, str]:
            # Both engines idle (the solo run's load has left every view of it): engine 0 takes the first.
            assert await asyncio.to_thread(poll, lambda: active(server) == (0, 0), 5), active(server)
            await asyncio.sleep(0.6)  # every frontend has heard it too (heartbeats: 4 a second)
            doomed, _ = await started(server.ws_url, LONG, seed=1)
            assert await asyncio.to_thread(poll, lambda: active(server) == (1, 0), 5), active(server)
            await asyncio.sleep(0.6)  # every frontend has heard engine 0's load
            bystander, head = await started(server.ws_url, LONG, seed=2)  # on engine 1, the freer
            assert await asyncio.to_thread(poll, lambda: active(server) == (1, 1), 5), active(server)
            os.kill(engine_pid(server, 0), signal.SIGKILL)
            (_, ended), (tail, finished) = await asyncio.gather(rest(doomed), rest(bystander))
            # The connection whose engine died speaks its next utterance on a live engine.
            _, again = await utterance(doomed, "Spoken after the engine died.", seed=3)
            await doomed.close()
            await bystander.close()
            return ended, head + tail, finished, again.finish_reason

        prober = threading.Thread(target=probe, daemon=True)
        prober.start()
        ended, audio, finished, again = asyncio.run(scenario())
        # Each frontend reconnects to engine 0's successor.
        assert poll(lambda: server.log.count("engine 0 rejoined") == 2, timeout=60), server.log
        probing.set()
        prober.join()
        assert ended == "engine_restarted", server.log
        assert finished in ("stop", "length"), server.log
        np.testing.assert_array_equal(np.frombuffer(audio, "<f4"), np.frombuffer(solo, "<f4"))
        assert again in ("stop", "length"), server.log
        assert readiness and set(readiness) == {200}, readiness
        assert len(re.findall(r"engine 0 started on", server.log)) == 2
        assert "engine 1 rejoined" not in server.log

        # Both engines take new utterances again, in the voice saved before the death.
        async def crowd() -> tuple[list[Done], list[tuple[float, float]]]:
            samples: list[tuple[float, float]] = []
            stop = asyncio.Event()
            watcher = asyncio.create_task(watch_engines(server, samples, stop))
            done = await asyncio.gather(*(in_voice(server, voice, seed) for seed in range(4)))
            stop.set()
            await watcher
            return done, samples

        done, samples = asyncio.run(crowd())
        assert all(d.finish_reason in ("stop", "length") for d in done)
        assert max(min(first, second) for first, second in samples) >= 1, samples
        # The successor hub holds that voice again: a frontend started now gets it in its welcome alone.
        frontend = frontend_pids(server)[0]
        os.kill(frontend, signal.SIGKILL)
        assert poll(lambda: frontend_pids(server).get(0, frontend) != frontend, timeout=30), server.log
        server.wait_ready()
        assert all(voice in voices(server) for _ in range(8))
        assert server.stop() == 0


def test_every_engine_dying_is_replaced_while_the_server_stays_up() -> None:
    """Issue 29, item 2: the last engine's death ended the service (exit 1); now every engine is replaced."""
    with sim_devices() as server:
        server.wait_ready()
        for index in (0, 1):
            os.kill(engine_pid(server, index), signal.SIGKILL)
        assert poll(lambda: server.status("/ready") == 503, timeout=10), server.log
        assert poll(lambda: server.log.count("rejoined") == 2, timeout=90), server.log
        server.wait_ready()
        assert asyncio.run(speak(server.ws_url, "After both died.", seed=4))[1].finish_reason in ("stop", "length")
        assert server.process.poll() is None
        assert server.stop() == 0
