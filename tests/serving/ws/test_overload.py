"""Issue 29.3, overload degrades, never kills: while an engine's steps cannot take one more stream within its real-time
budget, a new session is refused ``busy`` (HTTP 503 with ``Retry-After``; on the WebSocket an ``error`` at the start
of the utterance), the stream it runs plays on, and ``/metrics`` says why. The simulated model makes the overload
exact: one stream's step takes 100 ms of the 144 ms budget (0.9 of a 160 ms chunk), two would take 200 ms."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
from aiohttp.test_utils import TestClient
from prometheus_client.parser import text_string_to_metric_families

from voxwire.engine import SynthesisParams
from voxwire.protocol.wire import End, Ready, Start, Text
from voxwire.serving.app import make_app
from voxwire.serving.runtime.keys import SPEAKER_KEY
from voxwire.serving.speech.service import SpeechJob

from .conftest import Connect, Serve, with_ws_routes, ws_config

pytestmark = pytest.mark.asyncio

SPEECH = {"model": "tts-1", "input": "A new session.", "response_format": "pcm"}


async def engine_metrics(client: TestClient) -> dict[str, float]:
    """The step-budget metrics of engine 0, by name."""
    async with client.get("/metrics") as response:
        text = await response.text()
    names = ("voxwire_step_cost_ratio", "voxwire_step_load_seconds", "voxwire_step_budget_seconds")
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name in (*names, "voxwire_sessions_shed_total") and sample.labels == {"engine": "0"}
    }


async def test_an_engine_over_its_step_budget_sheds_new_sessions_busy_and_says_why(
    serve: Serve, connect: Connect, aiohttp_client: Callable[..., Awaitable[TestClient]]
) -> None:
    config = ws_config(model="sim", sim_cost="100ms/row", realtime=True)  # --max-step-load 0.9, the default
    server = await serve(app=with_ws_routes(make_app(config)))
    client = await aiohttp_client(server)
    service = server.app[SPEAKER_KEY]
    live = service.speak(SpeechJob("live", "A stream that plays on.", SynthesisParams(min_len=10_000, max_len=10_000)))
    try:
        await anext(live)  # running: a second stream would make every step 200 ms, for 160 ms of audio
        async with client.post("/v1/audio/speech", json=SPEECH) as response:
            assert response.status == 503
            assert response.headers["Retry-After"] == "1"
            error = (await response.json())["error"]
            assert error["code"] == "busy" and "budget" in error["message"]
        stream = await connect(server)
        await stream.send(Start(format="pcm_f32le"))
        await stream.expect(Ready)
        await stream.send(Text("A new utterance. "))
        await stream.send(End())
        await stream.error("busy")
        metrics = await engine_metrics(client)
        assert metrics["voxwire_sessions_shed_total"] == 2
        assert metrics["voxwire_step_budget_seconds"] == pytest.approx(0.144)
        assert metrics["voxwire_step_cost_ratio"] >= 1.0  # the simulator's steps take their cost, or longer
        assert metrics["voxwire_step_load_seconds"] >= 0.1  # the live stream alone
        assert (await anext(live)).audio.size  # the live stream plays on
    finally:
        await live.aclose()
    async with client.post("/v1/audio/speech", json=SPEECH) as response:  # nothing committed: admitted again
        assert response.status == 200
        assert await response.read()
