"""The app's life: probes, metrics, client disconnects, graceful shutdown (WebSockets closed with 1001)."""

from __future__ import annotations

import asyncio
import io
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
import soundfile
from aiohttp import WSMsgType, web
from aiohttp.test_utils import TestClient
from tests.serving.helpers import scrape

from voxwire import __version__
from voxwire.engine import SynthesisParams
from voxwire.protocol.wire import ErrorCode
from voxwire.serving.app import drain, run_app
from voxwire.serving.runtime.keys import (
    CONFIG_KEY,
    ENGINES_KEY,
    METRICS_KEY,
    SESSIONS_KEY,
    SPEAKER_KEY,
    STATE_KEY,
    Phase,
)
from voxwire.serving.speech.service import SpeechFailure, SpeechJob

pytestmark = pytest.mark.asyncio

SPEECH = {"model": "tts-1", "input": "A sentence to speak.", "voice": "alloy", "response_format": "wav", "seed": 5}


async def status_and_code(client: TestClient, method: str, path: str, **kwargs: object) -> tuple[int, str | None]:
    async with client.request(method, path, **kwargs) as response:
        body = await response.json() if response.content_type == "application/json" else {}
        return response.status, body.get("error", {}).get("code")


async def test_probes_follow_the_lifecycle(client: TestClient) -> None:
    state = client.server.app[STATE_KEY]
    async with client.get("/health") as response:
        assert (response.status, await response.json()) == (200, {"status": "ok"})
    async with client.get("/ready") as response:
        # Public: says nothing about the deployment, e.g. not the model's local path (probe defect D12).
        assert (response.status, await response.json()) == (200, {"status": "ready"})
    state.phase = Phase.STARTING
    assert await status_and_code(client, "GET", "/ready") == (503, "not_ready")
    assert await status_and_code(client, "POST", "/v1/audio/speech", json=SPEECH) == (503, "not_ready")
    assert (await status_and_code(client, "GET", "/health"))[0] == 200
    state.phase = Phase.READY


async def test_metrics_count_audio_latency_errors_and_steps(client: TestClient) -> None:
    before = await scrape(client)
    async with client.post("/v1/audio/speech", json=SPEECH) as response:
        audio, rate = soundfile.read(io.BytesIO(await response.read()))
    await status_and_code(client, "POST", "/v1/audio/speech", json={**SPEECH, "response_format": "vorbis"})
    await status_and_code(client, "GET", "/v1/voices/voice_0123456789abcdef/nothing")
    assert await status_and_code(client, "DELETE", "/v1/voices/voice_0123456789abcdef") == (404, "unknown_voice")
    assert (await status_and_code(client, "PROPFIND", "/v1/voices"))[0] == 405
    after = await scrape(client)
    assert after["voxwire_audio_seconds_total"] - before["voxwire_audio_seconds_total"] == pytest.approx(
        audio.size / rate
    )
    count = "voxwire_time_to_first_audio_seconds_count"
    assert after[count] - before[count] == 1
    assert after['voxwire_errors_total{code="unsupported_format"}'] == 1
    # A path no route matches is counted with the HTTP requests, not as an error of the service.
    assert 'voxwire_errors_total{code="not_found"}' not in after
    assert after['voxwire_http_requests_total{method="GET",route="unmatched",status="404"}'] == 1
    speech = 'method="POST",route="/v1/audio/speech"'
    assert after[f'voxwire_http_requests_total{{{speech},status="200"}}'] == 1
    assert after[f'voxwire_http_requests_total{{{speech},status="400"}}'] == 1
    assert after[f"voxwire_http_request_duration_seconds_count{{{speech}}}"] == 2
    # By route template, never the raw path (the voice id is not a label value); unknown methods are "other".
    voice = 'method="DELETE",route="/v1/voices/{voice_id}",status="404"'
    assert (
        after[f"voxwire_http_requests_total{{{voice}}}"] == 1
        and after['voxwire_errors_total{code="unknown_voice"}'] == 1
    )
    assert after['voxwire_http_requests_total{method="other",route="unmatched",status="405"}'] == 1
    assert (
        after['voxwire_utterances_total{finish_reason="stop"}']
        + after.get('voxwire_utterances_total{finish_reason="length"}', 0)
        >= 1
    )
    engine = '{engine="0"}'  # the engine's load is labelled by engine (one per --devices entry)
    steps = f"voxwire_engine_step_seconds_count{engine}"
    assert after[steps] > before[steps]
    assert after[f"voxwire_engine_step_seconds_sum{engine}"] > 0
    # Histograms: the +Inf bucket holds every step, and the buckets resolve 25-300 ms.
    assert after['voxwire_engine_step_seconds_bucket{engine="0",le="+Inf"}'] == after[steps]
    for bound in ("0.025", "0.05", "0.1", "0.15", "0.2", "0.3"):
        assert f'voxwire_engine_queue_wait_seconds_bucket{{engine="0",le="{bound}"}}' in after
        assert f'voxwire_time_to_first_audio_seconds_bucket{{le="{bound}"}}' in after
    waits = f"voxwire_engine_queue_wait_seconds_count{engine}"
    assert after[waits] - before[waits] == 1  # the one spoken request (the refused one never reached the engine)
    for gauge in ("voxwire_engine_requests_running", "voxwire_engine_requests_waiting"):
        assert after[gauge + engine] == 0
    assert after["voxwire_websocket_connections"] == 0
    assert after["voxwire_utterances_in_progress"] == 0
    config, model = client.server.app[CONFIG_KEY], client.server.app[SPEAKER_KEY].info.name
    build = f'voxwire_build_info{{device="{config.engine.device or "auto"}",model="{model}",version="{__version__}"}}'
    assert after[build] == 1
    assert after['process_resident_memory_bytes{process="server"}'] > 0
    assert after[f"voxwire_kv_blocks_used{engine}"] == 0 and after[f"voxwire_kv_blocks_total{engine}"] > 0
    captures = f"voxwire_graph_captures_total{engine}"
    assert after[captures] == before[captures] == 0  # CPU: no graphs
    assert after[f"voxwire_graph_capture_seconds{engine}"] == 0


async def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    async def poll() -> None:
        while not condition():
            await asyncio.sleep(0.01)

    await asyncio.wait_for(poll(), timeout)


async def test_a_client_that_leaves_mid_stream_frees_its_slot(client: TestClient, slow_down) -> None:
    app = client.server.app
    slow_down(app, 0.2)
    response = await client.post("/v1/audio/speech", json={**SPEECH, "response_format": "pcm"})
    await response.content.readany()  # audio is flowing
    response.close()  # the client goes away without reading the rest
    await wait_until(lambda: app[STATE_KEY].live_utterances == 0)
    await wait_until(lambda: app[ENGINES_KEY].engine.stats().running == 0)
    assert (await scrape(client))['voxwire_dropped_sessions_total{reason="client_disconnected"}'] == 1


async def test_shutdown_drains_a_live_stream_then_stops_the_engine(serve, aiohttp_client, slow_down) -> None:
    client = await aiohttp_client(await serve(drain_timeout_s=30.0))
    app = client.server.app
    slow_down(app, 0.1)
    async with client.post("/v1/audio/speech", json=SPEECH) as response:
        first = await response.content.readany()
        draining = asyncio.create_task(drain(app))
        await asyncio.sleep(0)
        assert app[STATE_KEY].live_utterances == 1  # still speaking when the drain began
        assert await status_and_code(client, "GET", "/ready") == (503, "shutting_down")
        assert await status_and_code(client, "POST", "/v1/audio/speech", json=SPEECH) == (503, "shutting_down")
        body = first + await response.read()  # the whole utterance: a truncated body would raise here
    audio, _ = soundfile.read(io.BytesIO(body))
    assert audio.size >= 4 * app[SPEAKER_KEY].info.samples_per_patch  # the stop head cannot fire sooner
    await asyncio.wait_for(draining, 10)
    with pytest.raises(SpeechFailure) as failure:
        await anext(app[SPEAKER_KEY].speak(SpeechJob("late", "Too late.", SynthesisParams())))
    assert failure.value.code is ErrorCode.UNAVAILABLE


async def test_shutdown_drains_a_live_generate_request_too(serve, aiohttp_client, slow_down, caplog) -> None:
    """Issue 20, item 9: the Nano-vLLM API's /generate was cut on SIGTERM (with ERROR tracebacks), not drained."""
    client = await aiohttp_client(await serve(drain_timeout_s=30.0))
    app = client.server.app
    slow_down(app, 0.1)
    body = {"target_text": "A sentence the drain lets finish.", "response_format": "pcm", "max_generate_length": 12}
    async with client.post("/generate", json=body) as response:
        first = await response.content.readany()
        draining = asyncio.create_task(drain(app))
        await asyncio.sleep(0)
        assert app[STATE_KEY].live_utterances == 1  # counted: the drain waits for it
        pcm = first + await response.read()  # the whole body: a cut one would raise here
    assert response.status == 200 and len(pcm) >= 2 * 4 * app[SPEAKER_KEY].info.samples_per_patch
    await asyncio.wait_for(draining, 10)
    assert not [record for record in caplog.records if record.levelname == "ERROR"]


async def test_a_drain_timeout_cuts_live_streams_short(serve, aiohttp_client, slow_down) -> None:
    client = await aiohttp_client(await serve(drain_timeout_s=0.2))
    app = client.server.app
    slow_down(app, 0.3)
    async with client.post("/v1/audio/speech", json=SPEECH) as response:
        await response.content.readany()
        draining = asyncio.create_task(drain(app))
        with pytest.raises(aiohttp.ClientPayloadError):
            await response.read()
    await asyncio.wait_for(draining, 10)
    assert app[METRICS_KEY].exposition().count(b'voxwire_dropped_sessions_total{reason="shutdown"} 1.0') == 1


def count_calls(owner: Any, method: str, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the calls of ``owner.method`` from now on: the list holds one number, the count."""
    calls = [0]
    original = getattr(owner, method)

    async def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return await original(*args, **kwargs)

    monkeypatch.setattr(owner, method, counted)
    return calls


async def test_a_normal_stop_drains_once_and_stops_the_engines_once(app_factory, monkeypatch) -> None:
    app = app_factory()
    config, state = app[CONFIG_KEY], app[STATE_KEY]
    waits = count_calls(state, "wait_idle", monkeypatch)  # the drain waits for live utterances once a run
    stops = count_calls(app[ENGINES_KEY], "stop", monkeypatch)
    server = asyncio.create_task(run_app(app, config))
    await wait_until(lambda: state.accepting, 60)
    state.stop.set()  # as SIGTERM does
    assert await asyncio.wait_for(server, 30) == 0
    assert (waits, stops) == ([1], [1])


async def registered_ws(request: web.Request) -> web.WebSocketResponse:
    """A WebSocket handler following the SESSIONS_KEY contract (as /v1/tts/stream does)."""
    ws = web.WebSocketResponse()
    await ws.prepare(request)
    sessions = request.app[SESSIONS_KEY]
    sessions.add(ws)
    try:
        async for _ in ws:
            pass
    finally:
        sessions.discard(ws)
    return ws


async def test_shutdown_closes_websockets_with_1001(serve, app_factory, aiohttp_client) -> None:
    app = app_factory()
    app.router.add_get("/test/ws", registered_ws)
    client = await aiohttp_client(await serve(app=app))
    ws = await client.ws_connect("/test/ws")
    await wait_until(lambda: len(app[SESSIONS_KEY]) == 1)
    assert (await scrape(client))["voxwire_websocket_connections"] == 1
    draining = asyncio.create_task(drain(app))
    message = await asyncio.wait_for(ws.receive(), 10)
    assert message.type is WSMsgType.CLOSE and message.data == 1001
    await asyncio.wait_for(draining, 10)
    assert not app[SESSIONS_KEY]
    # The upgrade is counted once its session ends (status 101), and not timed: its duration is the session's.
    await wait_until(lambda: ws.closed)
    scraped = await scrape(client)
    assert scraped['voxwire_http_requests_total{method="GET",route="/test/ws",status="101"}'] == 1
    assert 'voxwire_http_request_duration_seconds_count{method="GET",route="/test/ws"}' not in scraped
