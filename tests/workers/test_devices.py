"""``voxwire serve --devices cpu,cpu``: two engine processes behind one frontend, utterances routed by load."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator

import numpy as np
import pytest
from tests.server_process import ServerProcess, poll
from tests.workers.test_workers import KEY, metric, speak, upload_voice, utterance

from voxwire.client.connection import Connection
from voxwire.protocol.wire import AudioFrame, Done, End, Start, Text

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
    return tuple(metric(scraped, f'voxwire_sessions_active{{engine="{i}"}}') for i in range(2))  # type: ignore[return-value]


async def watch_engines(server: ServerProcess, samples: list[tuple[float, float]], stop: asyncio.Event) -> None:
    while not stop.is_set():
        samples.append(await asyncio.to_thread(active, server))
        await asyncio.sleep(0.05)


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

    async def in_voice(seed: int) -> Done:
        async with await Connection.open(server.ws_url, KEY) as connection:
            await connection.configure(Start(format="pcm_f32le", seed=seed, voice=voice))
            await connection.send(Text(LONG))
            await connection.send(End())
            while not isinstance(message := await asyncio.wait_for(connection.receive(), 60), Done):
                pass
            return message

    async def both() -> tuple[list[Done], list[tuple[float, float]]]:
        samples: list[tuple[float, float]] = []
        stop = asyncio.Event()
        watcher = asyncio.create_task(watch_engines(server, samples, stop))
        done = await asyncio.gather(*(in_voice(seed) for seed in range(4)))
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
