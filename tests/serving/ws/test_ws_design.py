"""Voice design and speed on ``/v1/tts/stream``: ``start.instructions``, a ``(description)`` typed at an
utterance's start, the voice names, every sentence designed and kept in one voice through reference audio (never
a continuation prompt), and ``start.speed`` (tempo changed, pitch kept, timings on the sped-up timeline)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from aiohttp import web

from voxwire.engine import SynthesisParams
from voxwire.prompt import VoicePrompt
from voxwire.protocol.wire import End, Ready, Start, Text
from voxwire.serving.runtime.keys import CONFIG_KEY, SPEAKER_KEY, VOICES_KEY
from voxwire.serving.speech.voice_design import OPENAI_VOICE_DESIGNS
from voxwire.speech_model import ModelInfo
from voxwire.tts import VoxCPM

from .conftest import ClipService, Connect, Heard, StreamClient, clip_app

pytestmark = pytest.mark.asyncio

RATE, PATCH = 16000, 1280
SENTENCES = ["Hello there.", "How are you today?", "Fine, thanks."]


def tone(seconds: float, frequency: float = 300.0) -> np.ndarray:
    t = np.arange(round(seconds * RATE)) / RATE
    return (0.5 * np.sin(2 * np.pi * frequency * t)).astype(np.float32)


class AppStream(StreamClient):
    """A stream client that knows its app (to reach its voice store)."""

    app: web.Application


async def clip_stream(
    aiohttp_server: Callable, connect: Connect, *, voice_design: bool = True, seconds: float = 0.8
) -> tuple[ClipService, AppStream]:
    service = ClipService(tone(seconds), RATE, PATCH)
    service.info = ModelInfo("clip", RATE, PATCH, reference_cloning=True, voice_design=voice_design)
    app = clip_app(service)
    stream = await connect(await aiohttp_server(app))
    stream.__class__ = AppStream
    stream.app = app
    return service, stream


async def utterance(stream: StreamClient, *texts: str, **settings: object) -> Heard:
    if settings:
        await stream.send(Start(**settings))  # type: ignore[arg-type]
        await stream.expect(Ready)
    for text in texts:
        await stream.send(Text(text))
    await stream.send(End())
    return await stream.heard()


async def test_instructions_design_every_sentence_and_the_first_ones_audio_is_the_reference(
    aiohttp_server: Callable, connect: Connect
) -> None:
    service, stream = await clip_stream(aiohttp_server, connect)
    heard = await utterance(stream, " ".join(SENTENCES), instructions=" A calm (low) voice ", format="pcm_f32le")
    assert heard.done is not None and heard.done.finish_reason == "stop" and not heard.errors
    assert [segment.text for segment in heard.segments] == SENTENCES
    assert [text for text, _, _ in service.requests] == [f"(A calm low voice){s}" for s in SENTENCES]
    prompts = [prompt for _, _, prompt in service.requests]
    assert prompts[0] is None
    first_reference = prompts[1]
    assert first_reference is not None and first_reference.audio_patches is None and first_reference.text == ""
    assert first_reference.reference_patches is not None
    assert first_reference.reference_patches.shape[0] == service.clip.size // PATCH, "the first sentence's patches"
    assert prompts[2] is first_reference, "one fixed reference: no drift, no growing prompt"


async def test_a_typed_description_covers_the_whole_utterance_and_replaces_starts(
    aiohttp_server: Callable, connect: Connect
) -> None:
    service, stream = await clip_stream(aiohttp_server, connect)
    await stream.send(Start(instructions="Slow", max_buffer_delay_ms=60_000))
    await stream.expect(Ready)
    heard = await utterance(stream, "  (A warm,", " gentle voice)Hello", " there. How are you today?")
    assert [segment.text for segment in heard.segments] == ["Hello there.", "How are you today?"]
    heard = await utterance(stream, "Fine, thanks. Bye.")
    assert [segment.text for segment in heard.segments] == ["Fine, thanks.", "Bye."]
    assert [text for text, _, _ in service.requests] == [
        "(A warm, gentle voice)Hello there.",
        "(A warm, gentle voice)How are you today?",
        "(Slow)Fine, thanks.",
        "(Slow)Bye.",
    ]


async def test_a_voice_name_is_its_design_and_default_is_not_designed(
    aiohttp_server: Callable, connect: Connect
) -> None:
    service, stream = await clip_stream(aiohttp_server, connect)
    await utterance(stream, "Hello there. Bye.", voice="Coral", instructions="whispering")
    await utterance(stream, "Hello there. Bye.", voice="default")
    texts = [text for text, _, _ in service.requests]
    coral = OPENAI_VOICE_DESIGNS["coral"]
    assert texts == [f"({coral}; whispering)Hello there.", f"({coral}; whispering)Bye.", "Hello there.", "Bye."]
    undesigned = [prompt for _, _, prompt in service.requests[2:]]
    assert undesigned[0] is None and undesigned[1] is not None and undesigned[1].text == "Hello there. "
    assert undesigned[1].audio_patches is not None, "an undesigned utterance continues its sentences, as before"


async def test_instructions_with_a_continuation_voice_are_refused_a_reference_voice_takes_them(
    aiohttp_server: Callable, connect: Connect
) -> None:
    service, stream = await clip_stream(aiohttp_server, connect)
    voices = stream.app[VOICES_KEY]
    voices.max_voices = 2
    patches = np.zeros((3, 2, 4), dtype=np.float32)
    continuation = await voices.add(VoicePrompt("This is me.", patches), name="c", duration_s=1.0)
    reference = await voices.add(VoicePrompt(reference_patches=patches), name="r", duration_s=1.0)
    await stream.send(Start(voice=continuation.id, instructions="whispering"))
    error = await stream.error("unsupported")
    assert "transcript" in error.message
    heard = await utterance(stream, "(Not taken)Hello there. Bye.", voice=continuation.id)
    assert not heard.errors
    heard = await utterance(stream, "Hello there. Bye.", voice=reference.id, instructions="whispering")
    assert not heard.errors
    texts = [text for text, _, _ in service.requests]
    # With a continuation voice a typed prefix is text as before; with a reference voice every sentence is designed
    # and keeps the voice's own reference.
    assert texts == ["(Not taken)Hello there.", "Bye.", "(whispering)Hello there.", "(whispering)Bye."]
    stored = voices.get(reference.id).prompt
    assert [prompt for _, _, prompt in service.requests[2:]] == [stored, stored]


async def test_a_model_without_voice_design_refuses_instructions_and_takes_no_prefix(
    aiohttp_server: Callable, connect: Connect
) -> None:
    service, stream = await clip_stream(aiohttp_server, connect, voice_design=False)
    await stream.send(Start(instructions="A calm voice"))
    error = await stream.error("unsupported")
    assert "VoxCPM2" in error.message
    await utterance(stream, "(A calm voice)Hello there. Bye.", voice="coral")
    assert [text for text, _, _ in service.requests] == ["(A calm voice)Hello there.", "Bye."]


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        ('{"type":"start","speed":5}', "out_of_range"),
        ('{"type":"start","speed":0.1}', "out_of_range"),
        ('{"type":"start","speed":"fast"}', "invalid_field"),
        ('{"type":"start","instructions":7}', "invalid_field"),
    ],
)
async def test_bad_speed_or_instructions_are_refused(
    aiohttp_server: Callable, connect: Connect, raw: str, code: str
) -> None:
    _, stream = await clip_stream(aiohttp_server, connect)
    await stream.send(raw)
    await stream.error(code)


@pytest.mark.parametrize("speed", [0.25, 0.5, 2.0, 4.0])
async def test_speed_scales_the_audio_keeps_the_pitch_and_times_the_segments_on_its_timeline(
    aiohttp_server: Callable, connect: Connect, speed: float
) -> None:
    service, stream = await clip_stream(aiohttp_server, connect, seconds=1.2)
    heard = await utterance(stream, "Hello there. Bye now.", format="pcm_f32le", speed=speed)
    pcm = heard.pcm()
    produced = 2 * service.clip.size
    assert abs(pcm.size - produced / speed) / RATE < 0.005
    spectrum = np.abs(np.fft.rfft(pcm * np.hanning(pcm.size)))
    assert abs(np.argmax(spectrum) * RATE / pcm.size - 300.0) < 3.0
    assert [segment.start_sample for segment in heard.segments] == [0, int(service.clip.size / speed)]
    assert heard.done is not None and abs(heard.done.audio_s - produced / RATE / speed) < 0.005


async def test_speed_one_is_the_audio_of_no_speed(aiohttp_server: Callable, connect: Connect) -> None:
    _, stream = await clip_stream(aiohttp_server, connect)
    plain = await utterance(stream, "Hello there.", format="opus")
    same = await utterance(stream, "Hello there.", format="opus", speed=1.0)
    assert plain.packets == same.packets


@pytest.mark.isa
async def test_a_designed_sentence_is_the_models_generate_of_the_designed_text(
    ws_server: Callable, connect: Connect, tiny_tts: VoxCPM
) -> None:
    server = await ws_server()
    assert server.app[SPEAKER_KEY].info.voice_design
    stream = await connect(server)
    heard = await utterance(stream, "Hello there.", instructions="A warm voice", seed=11, format="pcm_f32le")
    expected = tiny_tts.generate("(A warm voice)Hello there.", SynthesisParams(seed=11))
    np.testing.assert_array_equal(heard.pcm(), expected)


async def test_instructions_over_the_limit_are_refused_and_the_session_goes_on(
    aiohttp_server: Callable, connect: Connect
) -> None:
    service, stream = await clip_stream(aiohttp_server, connect)
    limit = stream.app[CONFIG_KEY].limits.max_text_chars_per_message  # as long as a text message may be
    await stream.send(Start(instructions="a" * (limit + 1), format="pcm_f32le"))
    assert str(limit) in (await stream.error("text_too_long")).message
    heard = await utterance(stream, SENTENCES[0], instructions="calm", format="pcm_f32le")
    assert heard.done is not None and heard.done.finish_reason == "stop" and not heard.errors
    assert [text for text, _, _ in service.requests] == [f"(calm){SENTENCES[0]}"]
