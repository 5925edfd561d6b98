"""``start.normalize``: each sentence is normalized after segmentation, off the event loop; ``segment`` carries
the text as written and as spoken, and the engine is given the spoken form."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from tests.serving.helpers import record_engine_jobs

from voxwire.protocol.wire import End, Ready, Start, Text
from voxwire.serving.ws import utterance as utterance_module
from voxwire.text import normalize as normalize_module

from .conftest import Connect, until

pytestmark = pytest.mark.asyncio


@pytest.mark.slow
async def test_a_number_split_across_messages_is_normalized_whole(
    ws_server: Callable, connect: Connect, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = await ws_server()
    jobs = record_engine_jobs(server.app, monkeypatch)
    stream = await connect(server)
    await stream.send(Start(normalize=True, max_buffer_delay_ms=60_000))
    await stream.expect(Ready)
    for piece in ("It costs $12.", "50 today. Call 555-123-4567", " now."):
        await stream.send(Text(piece))
    await stream.send(End())
    heard = await stream.heard()
    assert [(s.text, s.spoken) for s in heard.segments] == [
        ("It costs $12.50 today.", "It costs twelve dollars and fifty cents today."),
        ("Call 555-123-4567 now.", "Call five five five, one two three, four five six seven now."),
    ]
    assert [job.text for job in jobs] == [s.spoken for s in heard.segments]
    assert heard.done is not None and heard.done.finish_reason == "stop"


async def test_off_by_default_spoken_is_the_text(
    ws_server: Callable, connect: Connect, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = await ws_server()
    jobs = record_engine_jobs(server.app, monkeypatch)
    stream = await connect(server)
    await stream.send(Text("It costs $12.50 today."))
    await stream.send(End())
    heard = await stream.heard()
    assert [(s.text, s.spoken) for s in heard.segments] == [("It costs $12.50 today.",) * 2]
    assert [job.text for job in jobs] == ["It costs $12.50 today."]


async def test_without_the_extra_start_normalize_is_refused_clearly(
    ws_server: Callable, connect: Connect, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(utterance_module, "normalizer_available", lambda: False)
    stream = await connect(await ws_server())
    await stream.send(Start(normalize=True))
    error = await stream.error("out_of_range")
    assert "pip install 'voxwire[normalize]'" in error.message
    await stream.send(Start(normalize=False))  # the session goes on
    assert (await stream.expect(Ready)).format == "opus"


async def test_start_normalize_loads_the_normalizer_before_any_text(
    ws_server: Callable, connect: Connect, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(normalize_module, "_normalizer", None)  # as in a fresh server process
    stream = await connect(await ws_server())
    await stream.send(Start(normalize=True))
    await stream.expect(Ready)
    await until(lambda: normalize_module._normalizer is not None, timeout=30.0)
