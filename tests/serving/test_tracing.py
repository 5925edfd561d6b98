"""OpenTelemetry traces (``voxwire[otel]``): the spans a collector receives, parented on the caller's W3C
``traceparent`` (its ``tracestate`` kept), through the SDK's in-memory exporter, the engine's steps among them at
the engine's own times; configured by the standard OTEL_* environment alone (a served process prints its spans with
``OTEL_TRACES_EXPORTER=console``), also with ``--workers``, where the engine's steps reach the frontend's trace from
another process; and without that environment, no opentelemetry module is ever imported."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from tests.server_process import ServerProcess, poll

from voxwire.serving.app import drain, runner_options
from voxwire.serving.runtime.keys import CONFIG_KEY, STATE_KEY, TRACING_KEY, Phase
from voxwire.serving.runtime.tracing import Tracing, tracing_requested

from .conftest import wait_ready

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
SPEECH = {"model": "tts-1", "input": "Trace this utterance.", "response_format": "pcm", "seed": 2}


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


def traced_app(
    app_factory: Callable[..., web.Application], exporter: InMemorySpanExporter, **overrides
) -> web.Application:
    """An app whose spans go to ``exporter`` (as ``OTEL_*`` would configure the SDK, with another exporter)."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app = app_factory(**overrides)
    app[TRACING_KEY] = Tracing(provider)
    return app


@pytest_asyncio.fixture
async def traced(serve, aiohttp_client, app_factory: Callable[..., web.Application], exporter) -> TestClient:
    client = await aiohttp_client(await serve(app=traced_app(app_factory, exporter)))
    exporter.clear()  # the warm-up is no request, but start from nothing all the same
    return client


async def finished(exporter: InMemorySpanExporter, name: str, count: int = 1) -> list[ReadableSpan]:
    """The finished spans named ``name``, once ``count`` are there (a request's span ends after its last byte)."""
    for _ in range(200):
        spans = [span for span in exporter.get_finished_spans() if span.name == name]
        if len(spans) >= count:
            return spans
        await asyncio.sleep(0.01)
    raise AssertionError(f"no span {name!r} among {[span.name for span in exporter.get_finished_spans()]}")


@pytest.mark.asyncio
async def test_a_speech_request_continues_the_callers_trace(traced: TestClient, exporter) -> None:
    headers = {"traceparent": TRACEPARENT, "tracestate": "agent=turn-3", "X-Request-Id": "turn-3"}
    async with traced.post("/v1/audio/speech", json=SPEECH, headers=headers) as response:
        assert response.status == 200
        assert len(await response.read()) > 0
    (request,) = await finished(exporter, "POST /v1/audio/speech")
    (utterance,) = await finished(exporter, "voxwire.utterance")
    (first_audio,) = await finished(exporter, "voxwire.first_audio")
    (queue,) = await finished(exporter, "voxwire.queue")

    assert request.kind is SpanKind.SERVER
    assert format(request.context.trace_id, "032x") == TRACE_ID
    assert request.parent is not None and format(request.parent.span_id, "016x") == PARENT_ID
    assert request.context.trace_state.get("agent") == "turn-3"
    assert request.attributes is not None
    assert request.attributes["http.route"] == "/v1/audio/speech"
    assert request.attributes["http.response.status_code"] == 200
    assert request.attributes["voxwire.request_id"] == "turn-3"
    assert request.status.status_code is StatusCode.UNSET

    assert utterance.parent is not None and utterance.parent.span_id == request.context.span_id
    assert first_audio.parent is not None and first_audio.parent.span_id == utterance.context.span_id
    assert utterance.context.trace_id == first_audio.context.trace_id == request.context.trace_id
    assert request.start_time <= utterance.start_time <= first_audio.end_time <= utterance.end_time <= request.end_time
    # The wait for an engine slot, as the engine measured it: from the submission, within the wait for first audio.
    assert queue.parent is not None and queue.parent.span_id == utterance.context.span_id
    assert queue.start_time == utterance.start_time == first_audio.start_time
    assert queue.end_time is not None and first_audio.end_time is not None
    assert queue.start_time <= queue.end_time <= first_audio.end_time
    # One span per engine output, at the times of the step that made it: the engine's, within the utterance's.
    assert utterance.attributes is not None and utterance.attributes["voxwire.outputs"] > 1
    steps = engine_steps(exporter, utterance)
    assert len(steps) == utterance.attributes["voxwire.outputs"]
    assert [attribute(step, "voxwire.output.index") for step in steps] == list(range(len(steps)))
    assert [attribute(step, "voxwire.engine_step.rows") for step in steps] == [1] * len(steps)  # served alone
    assert utterance.start_time <= steps[0].start_time and steps[-1].end_time <= utterance.end_time
    assert steps[0].end_time <= first_audio.end_time  # the first audio is the first step's
    assert_in_order_without_overlap(steps)
    assert utterance.attributes["voxwire.finish_reason"] in ("stop", "length")
    reasons = [(step.attributes or {}).get("voxwire.finish_reason") for step in steps]
    assert reasons == [None] * (len(steps) - 1) + [utterance.attributes["voxwire.finish_reason"]]
    samples = sum(attribute(step, "voxwire.output.samples") for step in steps)
    assert utterance.attributes["voxwire.audio_samples"] == samples > 0


@pytest.mark.asyncio
async def test_a_step_shared_by_two_utterances_has_the_same_times_in_both(
    traced: TestClient, exporter, slow_down
) -> None:
    slow_down(traced.server.app, 0.01)  # every step lasts 10 ms or more: the two requests' utterances overlap

    async def speak(seed: int) -> None:
        async with traced.post("/v1/audio/speech", json={**SPEECH, "seed": seed}) as response:
            assert response.status == 200 and len(await response.read()) > 0

    await asyncio.gather(speak(1), speak(2))
    utterances = await finished(exporter, "voxwire.utterance", 2)
    first, second = (engine_steps(exporter, utterance) for utterance in utterances)
    for steps in (first, second):
        assert_in_order_without_overlap(steps)
        assert all(step.end_time - step.start_time >= 10_000_000 for step in steps)  # the forward pass is inside
        assert {attribute(step, "voxwire.engine_step.rows") for step in steps} <= {1, 2}
    times = {(step.start_time, step.end_time): attribute(step, "voxwire.engine_step.rows") for step in first}
    shared = [step for step in second if (step.start_time, step.end_time) in times]
    assert shared, "the two utterances were never in one step"
    assert all(attribute(step, "voxwire.engine_step.rows") == 2 for step in shared)
    assert all(times[step.start_time, step.end_time] == 2 for step in shared)


def engine_steps(exporter: InMemorySpanExporter, utterance: ReadableSpan) -> list[ReadableSpan]:
    """The ``voxwire.engine_step`` spans of ``utterance`` (its children, in the trace), by start time."""
    steps = [
        span
        for span in exporter.get_finished_spans()
        if span.name == "voxwire.engine_step" and span.parent is not None
        and span.parent.span_id == utterance.context.span_id
    ]  # fmt: skip
    assert all(step.context.trace_id == utterance.context.trace_id for step in steps)
    return sorted(steps, key=lambda step: step.start_time or 0)


def assert_in_order_without_overlap(steps: list[ReadableSpan]) -> None:
    """Each step ends after it starts, before the next one starts, and they come in their outputs' order."""
    assert [attribute(step, "voxwire.output.index") for step in steps] == list(range(len(steps)))
    for step, following in itertools.pairwise(steps):
        assert step.start_time is not None and step.end_time is not None and following.start_time is not None
        assert step.start_time < step.end_time <= following.start_time


def attribute(span: ReadableSpan, name: str) -> int:
    assert span.attributes is not None
    return int(span.attributes[name])  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_each_sentence_of_a_websocket_utterance_is_a_segment_span_of_the_connection(
    traced: TestClient, exporter
) -> None:
    async with traced.ws_connect("/v1/tts/stream", headers={"traceparent": TRACEPARENT}) as ws:
        assert (await ws.receive_json())["type"] == "ready"
        await ws.send_json({"type": "text", "text": "The first sentence. And the second one.", "context_id": "turn-1"})
        await ws.send_json({"type": "end", "context_id": "turn-1"})
        while (message := await ws.receive()).type is not aiohttp.WSMsgType.TEXT or '"done"' not in message.data:
            assert message.type in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY), message
    (connection,) = await finished(exporter, "GET /v1/tts/stream")
    segments = sorted(await finished(exporter, "voxwire.segment", 2), key=lambda span: span.start_time or 0)

    assert connection.parent is not None and format(connection.parent.span_id, "016x") == PARENT_ID
    assert [attribute(segment, "voxwire.segment.index") for segment in segments] == [0, 1]
    for segment in segments:
        assert segment.parent is not None and segment.parent.span_id == connection.context.span_id
        assert segment.attributes is not None and segment.attributes["voxwire.context_id"] == "turn-1"
        assert attribute(segment, "voxwire.utterance.number") == 0
        assert segment.attributes["voxwire.finish_reason"] in ("stop", "length")
        assert segment.status.status_code is StatusCode.UNSET
        # Each sentence is one engine request, traced as an HTTP utterance is: queue, first audio, its steps.
        children = {
            span.name
            for span in exporter.get_finished_spans()
            if span.parent and span.parent.span_id == segment.context.span_id
        }
        assert {"voxwire.queue", "voxwire.first_audio", "voxwire.engine_step"} <= children
        steps = engine_steps(exporter, segment)
        assert len(steps) == attribute(segment, "voxwire.outputs")
        assert_in_order_without_overlap(steps)
    assert segments[0].end_time is not None and segments[1].start_time is not None
    assert segments[0].end_time <= segments[1].end_time


@pytest.mark.asyncio
async def test_a_cancelled_websocket_sentence_ends_its_span_without_an_error(
    traced: TestClient, exporter, slow_down
) -> None:
    slow_down(traced.server.app, 0.05)
    async with traced.ws_connect("/v1/tts/stream") as ws:
        assert (await ws.receive_json())["type"] == "ready"
        await ws.send_json({"type": "text", "text": "A sentence long enough to be cut off in the middle of it."})
        await ws.send_json({"type": "flush"})
        while (await ws.receive()).type is not aiohttp.WSMsgType.BINARY:  # its first audio
            pass
        await ws.send_json({"type": "cancel"})
        while (message := await ws.receive()).type is not aiohttp.WSMsgType.TEXT or '"done"' not in message.data:
            pass
    (segment,) = await finished(exporter, "voxwire.segment")
    assert segment.status.status_code is StatusCode.UNSET  # the client stopped it: not a server failure
    assert segment.attributes is not None and "voxwire.finish_reason" not in segment.attributes


@pytest.mark.asyncio
async def test_without_a_traceparent_the_request_starts_a_trace(traced: TestClient, exporter) -> None:
    async with traced.get("/v1/models") as response:
        assert response.status == 200
    (span,) = await finished(exporter, "GET /v1/models")
    assert span.parent is None and span.kind is SpanKind.SERVER


@pytest.mark.asyncio
async def test_error_spans_name_the_route_template_and_fail_only_on_server_errors(traced: TestClient, exporter) -> None:
    async with traced.delete("/v1/voices/voice_0123456789abcdef") as response:
        assert response.status == 404
    async with traced.get("/no/such/route?token=secret") as response:
        assert response.status == 404
    (unknown_voice,) = await finished(exporter, "DELETE /v1/voices/{voice_id}")
    (no_route,) = await finished(exporter, "GET")
    for span in (unknown_voice, no_route):
        assert span.attributes is not None and span.attributes["http.response.status_code"] == 404
        assert span.status.status_code is StatusCode.UNSET  # a client's error is not the server's
    assert no_route.attributes is not None and "http.route" not in no_route.attributes
    assert all("secret" not in str(value) for value in no_route.attributes.values())  # never the query string


@pytest.mark.asyncio
async def test_a_server_error_fails_the_request_span(traced: TestClient, exporter) -> None:
    state = traced.server.app[STATE_KEY]
    state.phase = Phase.DRAINING  # what SIGTERM does first: new work gets 503
    async with traced.post("/v1/audio/speech", json=SPEECH) as response:
        assert response.status == 503
    state.phase = Phase.READY
    (span,) = await finished(exporter, "POST /v1/audio/speech")
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes is not None and span.attributes["http.response.status_code"] == 503


@pytest.mark.asyncio
async def test_a_stream_cut_short_fails_both_spans(serve, aiohttp_client, app_factory, exporter, slow_down) -> None:
    client = await aiohttp_client(await serve(app=traced_app(app_factory, exporter, drain_timeout_s=0.2)))
    app = client.server.app
    slow_down(app, 0.3)
    async with client.post("/v1/audio/speech", json=SPEECH) as response:
        await response.content.readany()
        draining = asyncio.create_task(drain(app))  # shutdown past its timeout ends the utterance early
        with pytest.raises(aiohttp.ClientPayloadError):
            await response.read()
    await asyncio.wait_for(draining, 10)
    (request,) = await finished(exporter, "POST /v1/audio/speech")
    (utterance,) = await finished(exporter, "voxwire.utterance")
    assert request.status.status_code is StatusCode.ERROR and utterance.status.status_code is StatusCode.ERROR
    assert "exception" in [event.name for event in utterance.events]
    assert utterance.attributes is not None and "voxwire.finish_reason" not in utterance.attributes


@pytest.mark.asyncio
async def test_shutdown_does_not_wait_on_an_unresponsive_collector(
    app_factory: Callable[..., web.Application], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A collector that accepts connections and never answers once held an idle server's exit for 10-30 s, past
    the kits' grace periods (security probe 4, F11): the span exporters get ``trace_flush_timeout_s`` (3 s), then
    the server stops without them. The SDK's own bound, here the exporter's 600 s, is what it waited on before."""
    with socket.create_server(("127.0.0.1", 0), backlog=16) as tarpit:  # never accepts: the kernel's backlog does
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{tarpit.getsockname()[1]}")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "600")  # seconds, in the Python SDK
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "10")  # the span is sent at once, and hangs there
        app = app_factory()
        assert app[TRACING_KEY] is not None
        server = TestServer(app, **runner_options(app[CONFIG_KEY]))
        await server.start_server()
        await wait_ready(app)
        async with aiohttp.ClientSession() as session, session.get(server.make_url("/v1/models")) as response:
            assert response.status == 200
        started = time.monotonic()
        await server.close()
        assert time.monotonic() - started < 20  # a hang test: 3 s allowed, the SDK would wait 30 s or more


@pytest.mark.parametrize(
    ("environment", "requested"),
    [
        ({}, False),
        ({"OTEL_SERVICE_NAME": "tts"}, False),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "TRUE"}, False),
    ],
)
def test_the_standard_environment_turns_traces_on(environment: dict[str, str], requested: bool) -> None:
    assert tracing_requested(environment) is requested


SERVED = textwrap.dedent(
    """
    import asyncio, json, sys
    from aiohttp.test_utils import TestClient, TestServer
    from voxwire.serving.app import make_app, runner_options
    from voxwire.serving.server_config import ServerConfig

    async def main():
        config = ServerConfig.of(model="sim", port=0, realtime=False)
        async with TestClient(TestServer(make_app(config), **runner_options(config))) as client:
            while (await client.get("/ready")).status != 200:
                await asyncio.sleep(0.05)
            async with client.get("/v1/models") as response:
                assert response.status == 200
            speech = {"model": "m", "input": "Hello there.", "response_format": "pcm"}
            async with client.post("/v1/audio/speech", json=speech, headers={"traceparent": sys.argv[1]}) as response:
                assert response.status == 200 and len(await response.read()) > 0
        loaded = sorted(name for name in sys.modules if name.partition(".")[0] == "opentelemetry")
        print("LOADED " + json.dumps(loaded))

    asyncio.run(main())
    """
)


def serve_in_a_process(environment: dict[str, str]) -> tuple[list[str], str]:
    """Serve two requests in a fresh process under ``environment`` (no other OTEL_*): the opentelemetry modules
    it loaded, and what it printed."""
    clean = {name: value for name, value in os.environ.items() if not name.startswith("OTEL_")}
    python_path = os.pathsep.join(filter(None, [str(Path(__file__).parents[2] / "server"), clean.get("PYTHONPATH")]))
    env = {**clean, "PYTHONPATH": python_path, **environment}
    run = subprocess.run(
        [sys.executable, "-c", SERVED, TRACEPARENT], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    marker = next(line for line in run.stdout.splitlines() if line.startswith("LOADED "))
    return json.loads(marker.removeprefix("LOADED ")), run.stdout


@pytest.mark.slow
def test_without_the_otel_environment_opentelemetry_is_never_imported() -> None:
    loaded, printed = serve_in_a_process({})
    assert loaded == []
    assert TRACE_ID not in printed


@pytest.mark.slow
def test_the_otel_environment_alone_exports_the_spans() -> None:
    loaded, printed = serve_in_a_process({"OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "tts-replica-2"})
    assert "opentelemetry.sdk.trace" in loaded
    spans = [json.loads(block) for block in split_json_objects(printed)]
    by_name = {span["name"]: span for span in spans}
    assert {"GET /v1/models", "POST /v1/audio/speech", "voxwire.utterance", "voxwire.first_audio"} <= set(by_name)
    speech = by_name["POST /v1/audio/speech"]
    assert speech["context"]["trace_id"] == f"0x{TRACE_ID}" and speech["parent_id"] == f"0x{PARENT_ID}"
    assert speech["resource"]["attributes"]["service.name"] == "tts-replica-2"


@pytest.mark.slow
def test_under_workers_a_frontend_exports_the_engine_processes_steps(tmp_path: Path) -> None:
    """``--workers 2``: the engine runs in its own process, which makes no spans; the frontend serving the request
    exports its steps, at the engine's times (every step lasts the simulator's cost: 20 ms)."""
    printed = tmp_path / "spans.json"
    environment = {"OTEL_TRACES_EXPORTER": "console", "OTEL_BSP_SCHEDULE_DELAY": "50", "PYTHONUNBUFFERED": "1"}
    into_file = ("sh", "-c", 'exec "$@" >>"$0"', str(printed))  # the server's stdout (every process's) to the file
    args = ("--model", "sim", "--sim-cost", "20ms", "--workers", "2", "--no-realtime")
    with ServerProcess(*args, env=environment, launcher=into_file) as server:
        server.wait_ready()
        body = json.dumps({"model": "m", "input": "Hello there.", "response_format": "pcm"}).encode()
        headers = {"Content-Type": "application/json", "traceparent": TRACEPARENT}
        request = urllib.request.Request(f"{server.url}/v1/audio/speech", body, headers)
        with urllib.request.urlopen(request, timeout=60) as response:
            assert response.status == 200 and len(response.read()) > 0

        def spans() -> list[dict[str, Any]]:
            return [json.loads(block) for block in split_json_objects(printed.read_text())]

        assert poll(lambda: any(span["name"] == "POST /v1/audio/speech" for span in spans()), timeout=30), server.log
    (utterance,) = [span for span in spans() if span["name"] == "voxwire.utterance"]
    assert utterance["context"]["trace_id"] == f"0x{TRACE_ID}"
    steps = [span for span in spans() if span["name"] == "voxwire.engine_step"]
    assert all(step["parent_id"] == utterance["context"]["span_id"] for step in steps)
    assert len(steps) == utterance["attributes"]["voxwire.outputs"] > 1
    steps.sort(key=lambda step: step["start_time"])
    assert [step["attributes"]["voxwire.output.index"] for step in steps] == list(range(len(steps)))
    assert {step["attributes"]["voxwire.engine_step.rows"] for step in steps} == {1}
    start, end = (datetime.fromisoformat(utterance[key]) for key in ("start_time", "end_time"))
    times = [(datetime.fromisoformat(step["start_time"]), datetime.fromisoformat(step["end_time"])) for step in steps]
    assert start <= times[0][0] and times[-1][1] <= end
    assert all(ended - began >= timedelta(milliseconds=20) for began, ended in times)  # the engine's step time
    assert all(ended <= following for (_, ended), (following, _) in itertools.pairwise(times))


def split_json_objects(printed: str) -> list[str]:
    """The console exporter's spans: indented JSON objects, one after another, among the other lines."""
    blocks, current = [], []
    for line in printed.splitlines():
        if line == "{":
            current = [line]
        elif current:
            current.append(line)
            if line == "}":
                blocks.append("\n".join(current))
                current = []
    return blocks
