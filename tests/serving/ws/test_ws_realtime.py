"""The real-time scheduler's inputs over the WebSocket: ``start.playback_lead_ms`` is validated, echoed in
``ready`` and handed to every request of the connection; a sentence continuing an utterance carries the time
its listener's buffer runs dry (``playback_due``), so it is scheduled as the same stream; the server runs
real-time with a measured step cost."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import pytest

from voxwire.engine.cost_model import StepCost
from voxwire.protocol.wire import AudioFrame, Done, End, Ready, Start, Text
from voxwire.serving.runtime.keys import ENGINES_KEY

from .conftest import ClipService, Connect, clip_app

pytestmark = pytest.mark.asyncio

RATE, PATCH = 16000, 1280


async def test_the_lead_a_client_announces_is_echoed_and_bounded(aiohttp_server: Callable, connect: Connect) -> None:
    server = await aiohttp_server(clip_app(ClipService(np.zeros(PATCH), RATE, PATCH), playback_lead_ms=250))
    stream = await connect(server)
    assert stream.ready is not None and stream.ready.playback_lead_ms == 250  # the server's default
    await stream.send(Start(playback_lead_ms=1200))
    assert (await stream.expect(Ready)).playback_lead_ms == 1200
    await stream.send('{"type":"start","playback_lead_ms":10001}')
    await stream.error("out_of_range")
    await stream.send('{"type":"start","playback_lead_ms":"300"}')
    await stream.error("invalid_field")
    await stream.send(Start())  # a start without the field goes back to the server's default
    assert (await stream.expect(Ready)).playback_lead_ms == 250


async def test_a_continuing_sentence_is_due_when_the_listeners_buffer_runs_dry(
    aiohttp_server: Callable, connect: Connect
) -> None:
    clip = np.full(3 * PATCH, 0.1, dtype=np.float32)  # every sentence "speaks" three chunks
    service = ClipService(clip, RATE, PATCH)
    server = await aiohttp_server(clip_app(service))
    stream = await connect(server)
    await stream.send(Start(playback_lead_ms=400, format="pcm_f32le"))
    await stream.expect(Ready)
    before_first_text = time.monotonic()
    await stream.send(Text("First sentence here. Second one follows. "))
    await stream.send(End())
    first_frame_at: float | None = None
    while not isinstance(received := await stream.receive(), Done):
        if isinstance(received, AudioFrame) and first_frame_at is None:
            first_frame_at = time.monotonic()
    assert first_frame_at is not None
    assert [text for text, _, _ in service.requests] == ["First sentence here.", "Second one follows."]
    (lead_1, due_1), (lead_2, due_2) = service.timings
    assert lead_1 == lead_2 == 0.4
    assert due_1 is None  # a new stream: its listener starts one lead after its first chunk leaves
    # The first chunk left between the first text and the first frame heard; the listener then plays
    # the lead and the first sentence's audio (3 chunks) before it needs the second sentence.
    assert due_2 is not None
    first_chunk_at = due_2 - 0.4 - clip.size / RATE
    assert before_first_text <= first_chunk_at <= first_frame_at


async def test_the_server_runs_real_time_on_its_measured_step_cost(ws_server: Callable, connect: Connect) -> None:
    # max_ahead_ms: no stream is paced to real time here, the test is that the measured policy serves.
    server = await ws_server(realtime=True, playback_lead_ms=200, max_ahead_ms=60_000)
    assert isinstance(server.app[ENGINES_KEY].runner.step_cost, StepCost)  # measured at start-up, as asked
    stream = await connect(server)
    assert stream.ready is not None and stream.ready.playback_lead_ms == 200
    await stream.send(Start(format="pcm_f32le", seed=1))
    await stream.expect(Ready)
    await stream.send(Text("Hello there. "))
    await stream.send(End())
    heard = await stream.heard()
    assert heard.done is not None and heard.done.finish_reason in ("stop", "length") and heard.pcm().size > 0
