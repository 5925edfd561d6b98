"""``start.max_ahead_ms``: how far ahead of its playback a WebSocket stream may be generated (``engine.policy``,
rule 5), by default ``--max-ahead-ms``, at most ``--max-ahead-limit-ms``."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from tests.serving.helpers import record_engine_jobs

from voxwire.protocol.wire import End, Ready, Start, Text

from .conftest import Connect

pytestmark = pytest.mark.asyncio


async def test_a_stream_runs_ahead_within_the_bound_its_start_asks_for(
    ws_server: Callable, connect: Connect, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = await ws_server(max_ahead_ms=800)
    jobs = record_engine_jobs(server.app, monkeypatch)
    stream = await connect(server)
    for start in (None, Start(max_ahead_ms=5000)):
        if start is not None:
            await stream.send(start)
            await stream.expect(Ready)
        await stream.send(Text("Hi."))
        await stream.send(End())
        await stream.heard()
    assert [job.request().max_ahead_s for job in jobs] == [0.8, 5.0]


async def test_a_bound_over_the_servers_limit_is_out_of_range(ws_server: Callable, connect: Connect) -> None:
    server = await ws_server(max_ahead_limit_ms=2000)
    stream = await connect(server)
    await stream.send(Start(max_ahead_ms=2001))
    error = await stream.error("out_of_range")
    assert "max_ahead_ms" in error.message and "2000" in error.message
    await stream.send(Start(max_ahead_ms=2000))
    await stream.expect(Ready)
