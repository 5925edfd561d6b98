"""LoRA personas on the WebSocket: ``start.persona`` picks one (echoed in ``ready``), the session hears exactly that
persona's audio, and an unknown or removed name is a typed ``unknown_persona`` error."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import numpy as np
import pytest
from aiohttp import web

from voxwire.params import SynthesisParams
from voxwire.protocol.wire import End, Ready, Segment, Start, Text
from voxwire.serving.runtime.keys import ENGINES_KEY, SPEAKER_KEY
from voxwire.serving.speech.persona_names import OPERATOR
from voxwire.serving.speech.service import SpeechJob, UtteranceOptions
from voxwire.tts import VoxCPM

from ..conftest import LORA, Serve
from .conftest import Connect, StreamClient, with_ws_routes

pytestmark = pytest.mark.asyncio

TEXT = "Hello there."


async def speak(stream: StreamClient, text: str) -> np.ndarray:
    await stream.send(Text(text))
    await stream.send(End())
    heard = await stream.heard()
    assert heard.errors == [] and heard.done is not None and heard.done.finish_reason in ("stop", "length")
    return heard.pcm()


@pytest.mark.isa
async def test_a_session_with_a_persona_hears_exactly_that_persona(
    serve: Serve, persona_app: Callable[..., web.Application], connect: Connect, persona_tts: VoxCPM
) -> None:
    server = await serve(app=with_ws_routes(persona_app()))
    stream = await connect(server)
    assert stream.ready is not None and stream.ready.persona is None

    await stream.send(Start(format="pcm_f32le", seed=11, persona="A"))
    ready = await stream.expect(Ready)
    assert ready.persona == "A"
    adapted = await speak(stream, TEXT)

    await stream.send(Start(format="pcm_f32le", seed=11))
    assert (await stream.expect(Ready)).persona is None
    base = await speak(stream, TEXT)

    # Alone in the engine on CPU, a request is bit-exact with the one-utterance API.
    np.testing.assert_array_equal(adapted, persona_tts.generate(TEXT, SynthesisParams(seed=11), lora="A"))
    np.testing.assert_array_equal(base, persona_tts.generate(TEXT, SynthesisParams(seed=11)))
    assert not np.array_equal(adapted[: base.size], base[: adapted.size])


async def test_an_unknown_persona_is_refused_and_the_settings_stay(
    serve: Serve, persona_app: Callable[..., web.Application], connect: Connect
) -> None:
    server = await serve(app=with_ws_routes(persona_app()))
    stream = await connect(server)
    await stream.send(Start(format="pcm_f32le", persona="A"))
    await stream.expect(Ready)

    await stream.send(Start(format="pcm_s16le", persona="nobody"))
    error = await stream.error("unknown_persona")
    assert "nobody" in error.message and "A" in error.message

    await stream.send(Text(TEXT))  # still speaks with the settings of the last accepted start
    await stream.send(End())
    heard = await stream.heard()
    assert heard.errors == [] and heard.frames and heard.frames[0].format == "pcm_f32le"


@pytest.mark.isa
async def test_a_removed_persona_finishes_in_flight_then_is_unknown(
    serve: Serve,
    persona_app: Callable[..., web.Application],
    connect: Connect,
    persona_tts: VoxCPM,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = await serve(app=with_ws_routes(persona_app()))
    expected = persona_tts.generate(TEXT, SynthesisParams(seed=3), lora="A")
    runner = server.app[ENGINES_KEY].runner
    execute = runner.execute

    def slow_step(plan: object) -> object:  # so the utterance is surely still running when the persona goes
        time.sleep(0.05)
        return execute(plan)

    monkeypatch.setattr(runner, "execute", slow_step)
    stream = await connect(server)
    await stream.send(Start(format="pcm_f32le", seed=3, persona="A"))
    await stream.expect(Ready)
    await stream.send(Text(TEXT))
    await stream.send(End())
    await stream.expect(Segment)  # the utterance is under way: its first audio frame follows

    assert persona_tts.personas is not None and persona_tts.personas.users("A") == 1  # held by this utterance
    await server.app[SPEAKER_KEY].personas.remove("A", owner=OPERATOR)
    heard = await stream.heard()
    assert heard.errors == []
    audio = heard.pcm()
    np.testing.assert_array_equal(audio, expected)

    await stream.send(Text(TEXT))  # the session's settings still name it: the next utterance fails, typed
    await stream.send(End())
    heard = await stream.heard()
    assert [error.code for error in heard.errors] == ["unknown_persona"] and heard.done is not None
    assert heard.done.finish_reason == "error"


async def test_an_utterance_that_gets_no_persona_slot_in_time_is_busy(
    serve: Serve, persona_app: Callable[..., web.Application], connect: Connect
) -> None:
    """Issue 20.6 on the WebSocket: with every persona slot held by other clients' long utterances, an utterance
    for another persona waits ``max_persona_wait_s`` and then ends with a typed ``busy`` error (was:
    ``synthesis_failed`` at once); once a slot frees, the same session speaks with it."""
    names = ("A", "B", "C", "D", "E")
    loras = tuple((name, LORA) for name in names)
    app = persona_app(loras=loras, max_personas=4, max_sessions=5, max_persona_wait_s=0.3)
    server = await serve(app=with_ws_routes(app))
    service = server.app[SPEAKER_KEY]
    long = SynthesisParams(min_len=10_000, max_len=10_000)
    holds = [
        service.speak(
            SpeechJob(f"hold-{name}", "One long utterance. " * 4, long, options=UtteranceOptions(name, owner=name))
        )
        for name in names[:4]
    ]
    try:
        for hold in holds:
            await asyncio.wait_for(anext(hold), 60)  # running: it holds its persona's slot
        stream = await connect(server)
        await stream.send(Start(format="pcm_f32le", persona="E"))
        await stream.expect(Ready)
        await stream.send(Text(TEXT))
        await stream.send(End())
        heard = await stream.heard()
        assert [error.code for error in heard.errors] == ["busy"] and "persona" in heard.errors[0].message
        assert heard.done is not None and heard.done.finish_reason == "error"
    finally:
        for hold in holds:
            await hold.aclose()
    while service.engine.stats().running:  # the holds' aborts are applied
        await asyncio.sleep(0.02)
    assert (await speak(stream, TEXT)).size > 0
