"""Hung processes under ``--workers`` (issue 20, items 2, 3 and 9): a stopped engine or frontend still holds its
sockets, so the supervisor watches each child's heartbeat and ends one that falls silent; losing the supervisor
counts as losing the engine; the supervisor's temporary folder does not outlive it; and the frontends share
one bound on connections."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from pathlib import Path

import pytest
from tests.server_process import ServerProcess, poll
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from voxwire.client.connection import Connection
from voxwire.client.errors import ServerError
from voxwire.protocol.wire import AudioFrame, Done, End, Error, Start, Text

from .helpers import LONG, TEXT, frontend_pids, speak

pytestmark = pytest.mark.slow

SILENCE_S = 2.0
"""--liveness-timeout-s of these servers."""


def sim_server(*extra: str, env: dict[str, str] | None = None) -> ServerProcess:
    args = ("--model", "sim", "--sim-cost", "60ms", "--workers", "2", "--liveness-timeout-s", str(SILENCE_S), *extra)
    process = ServerProcess(*args, env=env)
    process.wait_ready()
    return process


def engine_pid(server: ServerProcess) -> int:
    """The pid of engine 0's latest process."""
    return int(re.findall(r"engine 0 started on .* \(pid (\d+)\)", server.log)[-1])


async def live_stream(url: str) -> Connection:
    """A connection mid-utterance (its first audio received)."""
    connection = await Connection.open(url)
    await connection.configure(Start(format="opus", seed=1))
    await connection.send(Text(LONG))
    await connection.send(End())
    while not isinstance(await asyncio.wait_for(connection.receive(), 60), AudioFrame):
        pass
    return connection


async def how_it_ends(connection: Connection, timeout: float) -> tuple[str, float]:
    """The stream's end (the code of an error it ended with, else its finish reason) and how long it took."""
    started = time.monotonic()
    error = None
    try:
        while not isinstance(message := await asyncio.wait_for(connection.receive(), timeout), Done):
            if isinstance(message, Error):
                error = message.code
        return error or message.finish_reason, time.monotonic() - started
    except ServerError as exc:
        return exc.code, time.monotonic() - started
    finally:
        await connection.close()


def fault_mid_stream(server: ServerProcess, signum: signal.Signals) -> tuple[str, float]:
    """Send ``signum`` to engine 0 while a stream plays; how the stream ends, and how long after the signal."""

    async def scenario() -> tuple[str, float]:
        connection = await live_stream(server.ws_url)
        os.kill(engine_pid(server), signum)
        return await how_it_ends(connection, timeout=30)

    return asyncio.run(scenario())


def speaks(server: ServerProcess) -> bool:
    _, done = asyncio.run(asyncio.wait_for(speak(server.ws_url, TEXT, seed=3, token=None), 60))
    return done.finish_reason in ("stop", "length")


def test_a_killed_engine_is_replaced_and_so_is_a_stopped_successor_while_the_server_stays_up() -> None:
    """Issue 29, item 2: the only engine's death no longer ends the service (it exited 1 before)."""
    with sim_server() as server:
        first = engine_pid(server)
        ended, after = fault_mid_stream(server, signal.SIGKILL)
        assert ended == "engine_restarted", server.log
        assert after < 5, after
        assert poll(lambda: server.status("/ready") == 503, timeout=5)  # while the successor starts
        assert poll(lambda: server.status("/ready") == 200, timeout=60), server.log
        assert engine_pid(server) != first
        assert speaks(server)

        ended, after = fault_mid_stream(server, signal.SIGSTOP)  # the successor, stopped: hung, not busy
        assert ended == "engine_restarted", server.log
        assert after < SILENCE_S + 5, after  # caught within the liveness timeout
        assert "showed no life" in server.log and "it was last" in server.log
        assert poll(lambda: server.status("/ready") == 200, timeout=60), server.log
        assert speaks(server)
        assert server.process.poll() is None  # the operator's process never exited
        assert server.stop() == 0


def test_a_crash_loop_ends_the_server_with_status_1_naming_it() -> None:
    with sim_server("--crash-loop-deaths", "2") as server:
        first = engine_pid(server)
        os.kill(first, signal.SIGKILL)
        assert poll(lambda: engine_pid(server) != first and server.status("/ready") == 200, timeout=60), server.log
        os.kill(engine_pid(server), signal.SIGKILL)
        assert server.process.wait(timeout=60) == 1, server.log
        assert "2 engine deaths within 600 s, a crash loop" in server.log


def test_a_step_longer_than_the_liveness_timeout_is_busy_not_hung() -> None:
    """The step outlasts --liveness-timeout-s (the old heartbeat, stamped between steps, ended this engine)."""
    step_s = SILENCE_S * 1.5
    args = ("--model", "sim", "--sim-cost", f"{step_s}s", "--workers", "1", "--liveness-timeout-s", str(SILENCE_S))
    with ServerProcess(*args) as server:
        server.wait_ready(timeout=120, probes=1)

        async def one() -> str:
            _, done = await speak(server.ws_url, "Hi.", seed=1, token=None)
            return done.finish_reason

        assert asyncio.run(asyncio.wait_for(one(), 120)) in ("stop", "length")
        assert "ending it" not in server.log, server.log
        assert server.stop() == 0


def test_a_hung_frontend_is_restarted_and_new_connections_are_served() -> None:
    with sim_server() as server:
        old = frontend_pids(server)
        os.kill(old[0], signal.SIGSTOP)
        assert poll(lambda: frontend_pids(server).get(0, old[0]) != old[0], timeout=SILENCE_S + 10), server.log
        assert "showed no life" in server.log

        async def eight() -> list[str]:
            done = await asyncio.gather(*(speak(server.ws_url, TEXT, seed=seed, token=None) for seed in range(8)))
            return [message.finish_reason for _, message in done]

        assert set(asyncio.run(asyncio.wait_for(eight(), 60))) <= {"stop", "length"}
        assert server.stop() == 0


def test_losing_the_supervisor_ends_streams_with_unavailable_at_once() -> None:
    server = sim_server()
    children = [engine_pid(server), *frontend_pids(server).values()]
    try:

        async def scenario() -> tuple[str, float]:
            connection = await live_stream(server.ws_url)
            server.process.kill()
            return await how_it_ends(connection, timeout=30)

        ended, after = asyncio.run(scenario())
        assert ended == "unavailable", server.log
        assert after < 5, after  # not the 30 s drain
        assert poll(lambda: not any(_alive(pid) for pid in children), timeout=30)
    finally:
        for pid in children:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_the_supervisors_folder_is_removed_and_a_dead_ones_is_swept(tmp_path: Path) -> None:
    dead = tmp_path / "voxwire-999999999-stale"  # no process has that pid
    (dead / "metrics").mkdir(parents=True)
    with sim_server(env={"TMPDIR": str(tmp_path)}) as server:
        assert not dead.exists()
        assert len(list(tmp_path.glob("voxwire-*"))) == 1  # its own
        assert server.stop() == 0
    assert list(tmp_path.glob("voxwire-*")) == []


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return not Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")


def test_max_connections_bounds_the_server_not_each_frontend() -> None:
    """Issue 20, item 9: with two frontends, --max-connections 4 admitted 8 (4 each)."""
    with sim_server("--max-connections", "4") as server:

        async def scenario() -> tuple[int, int]:
            held = [await connect(server.ws_url) for _ in range(4)]
            await asyncio.sleep(1.2)  # every frontend has published its count (twice a second)
            refused = 0
            for _ in range(4):
                try:
                    extra = await connect(server.ws_url)
                except InvalidStatus as exc:
                    assert exc.response.status_code == 503
                    refused += 1
                else:
                    held.append(extra)
            await held.pop(0).close()
            await asyncio.sleep(1.2)
            room = await connect(server.ws_url)  # a closed connection frees its place server-wide
            await room.close()
            for connection in held:
                await connection.close()
            return refused, len(held)

        refused, _ = asyncio.run(scenario())
        assert refused == 4
        assert server.stop() == 0


def test_max_connections_holds_across_frontends_under_a_burst() -> None:
    """Probe 4, N10r: 600 upgrades at once over two frontends got 512 sockets against a cap of 256, each
    frontend admitting against the other's count as published at its last beat."""
    cap = 16
    with sim_server("--max-connections", str(cap)) as server:

        async def burst() -> tuple[int, int]:
            async def one() -> object:
                try:
                    return await connect(server.ws_url, open_timeout=30)
                except InvalidStatus as exc:
                    return exc.response.status_code

            results = await asyncio.gather(*(one() for _ in range(6 * cap)))
            held = [result for result in results if not isinstance(result, int)]
            refused = [result for result in results if isinstance(result, int)]
            assert set(refused) <= {503}
            for connection in held:
                await connection.close()  # type: ignore[attr-defined]
            return len(held), len(refused)

        held, refused = asyncio.run(burst())
        assert held == cap, (held, refused)
        assert server.stop() == 0
