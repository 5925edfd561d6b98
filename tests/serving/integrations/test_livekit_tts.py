"""``voxwire.integrations.livekit.VoxwireTTS`` in LiveKit Agents' own TTS machinery, with the server in process."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from livekit.agents.tts import SynthesizedAudio

from voxwire.integrations.livekit import VoxwireTTS
from voxwire.serving.keys import SERVICE_KEY
from voxwire.serving.service import SpeechJob

pytestmark = pytest.mark.asyncio

STEP_S = 0.1
TIMEOUT_S = 60.0


def record_requests(app: object, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, bool]]:
    """(text, continued from a previous sentence) of every request the server's engine is given."""
    service = app[SERVICE_KEY]  # type: ignore[index]
    requests: list[tuple[str, bool]] = []
    speak = service.speak

    def recording(job: SpeechJob) -> object:
        requests.append((job.text, job.voice is not None))
        return speak(job)

    monkeypatch.setattr(service, "speak", recording)
    return requests


def engine_busy(app: object) -> bool:
    stats = app[SERVICE_KEY].engine.stats()  # type: ignore[index]
    return bool(stats.running or stats.waiting)


def samples_of(events: list[SynthesizedAudio]) -> np.ndarray:
    return np.concatenate([np.frombuffer(event.frame.data, dtype=np.int16) for event in events])


async def test_stream_speaks_incremental_text_before_it_ends(serve, slow_down, monkeypatch) -> None:
    server = await serve()
    slow_down(server.app, 0.02)
    requests = record_requests(server.app, monkeypatch)
    tts = VoxwireTTS(server=str(server.make_url("/")), seed=1)
    stream = tts.stream()
    for token in ("The first ", "sentence is ", "here. ", "The second"):
        stream.push_text(token)
    first = await asyncio.wait_for(anext(stream), TIMEOUT_S)  # the second sentence is not complete yet
    assert first.frame.sample_rate == 24000 and first.frame.num_channels == 1
    stream.push_text(" one ends now.")
    stream.end_input()
    rest = [event async for event in stream]
    await stream.aclose()
    await tts.aclose()
    assert requests == [("The first sentence is here.", False), ("The second one ends now.", True)]
    assert samples_of([first, *rest]).size > 0
    assert rest[-1].is_final


async def test_synthesize_speaks_a_whole_text(serve) -> None:
    server = await serve()
    tts = VoxwireTTS(server=str(server.make_url("/")))
    async with tts.synthesize("Hello from LiveKit. It works.") as stream:
        events = [event async for event in stream]
    await tts.aclose()
    audio = samples_of(events)
    assert audio.size > 0 and np.abs(audio).max() > 0
    assert {event.frame.sample_rate for event in events} == {24000}


def record_steps(app: object, step_s: float) -> list[tuple[float, tuple[str, ...]]]:
    """Slow every engine step to ``step_s`` and log (start time, requests decoded) of each."""
    runner = app[SERVICE_KEY].runner  # type: ignore[index]
    execute = runner.execute
    steps: list[tuple[float, tuple[str, ...]]] = []

    def logged(plan: object) -> object:
        steps.append((time.perf_counter(), tuple(plan.request_ids)))  # type: ignore[attr-defined]
        time.sleep(step_s)
        return execute(plan)

    runner.execute = logged
    return steps


async def test_interruption_stops_the_server_within_one_step(serve) -> None:
    server = await serve()
    steps = record_steps(server.app, STEP_S)
    tts = VoxwireTTS(server=str(server.make_url("/")))
    stream = tts.stream()
    stream.push_text("This sentence is long enough to keep speaking for a while. And another one follows it. ")
    await asyncio.wait_for(anext(stream), TIMEOUT_S)
    assert engine_busy(server.app)
    await stream.aclose()  # what LiveKit does when the user barges in
    interrupted = time.perf_counter()
    while engine_busy(server.app):
        await asyncio.sleep(0.005)
    await tts.aclose()
    decoding_after = [ids for started, ids in steps if started > interrupted and ids]
    assert len(decoding_after) <= 1, f"{len(decoding_after)} steps still decoded the utterance after the interruption"
