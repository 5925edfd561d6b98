"""Word timings on ``/v1/tts/stream``: after each sentence's audio frames a ``words`` message times its words,
estimated from the audio produced for it (its leading and trailing silence belong to no word), on the utterance's
timeline (``segment.start_sample``), after any ``speed``."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from voxwire.protocol.wire import AudioFrame, Done, End, Ready, Segment, ServerMessage, Start, Text, Words

from .conftest import ClipService, Connect, StreamClient, clip_app

pytestmark = pytest.mark.asyncio

RATE, PATCH = 16000, 1280
SILENCE_S, SPEECH_S = 0.24, 0.8
"""Each sentence's clip: silence, a tone standing for speech, silence (1.28 s: 16 patches)."""
TEXT = "Hello there, world. How are you today?"


def sentence_clip() -> np.ndarray:
    t = np.arange(round(SPEECH_S * RATE)) / RATE
    quiet = np.zeros(round(SILENCE_S * RATE))
    return np.concatenate([quiet, 0.5 * np.sin(2 * np.pi * 220 * t), quiet]).astype(np.float32)


async def messages_of_one_utterance(stream: StreamClient, **settings: object) -> list[ServerMessage | AudioFrame]:
    await stream.send(Start(format="pcm_f32le", **settings))  # type: ignore[arg-type]
    await stream.expect(Ready)
    await stream.send(Text(TEXT))
    await stream.send(End())
    received: list[ServerMessage | AudioFrame] = []
    while not received or not isinstance(received[-1], Done):
        received.append(await stream.receive())
    return received


async def test_each_sentence_times_its_words_within_its_speech_after_its_frames(
    aiohttp_server: Callable, connect: Connect
) -> None:
    stream = await connect(await aiohttp_server(clip_app(ClipService(sentence_clip(), RATE, PATCH))))
    received = await messages_of_one_utterance(stream)
    segments = [m for m in received if isinstance(m, Segment)]
    timed = [m for m in received if isinstance(m, Words)]
    assert [w.index for w in timed] == [s.index for s in segments] == [0, 1]
    for segment, words in zip(segments, timed, strict=True):
        assert words.utterance == segment.utterance and words.words == tuple(segment.text.split())
        between = received[received.index(segment) : received.index(words)]
        samples = sum(
            len(packet) // 4 for frame in between if isinstance(frame, AudioFrame) for packet in frame.packets
        )
        assert samples == sentence_clip().size  # every frame of the sentence came before its words
        begins = segment.start_sample / RATE
        # The speech span, not the silence around it: within one 10 ms loudness frame.
        assert words.starts_s[0] == pytest.approx(begins + SILENCE_S, abs=0.011)
        assert words.ends_s[-1] == pytest.approx(begins + SILENCE_S + SPEECH_S, abs=0.011)
        assert all(a <= b for a, b in zip(words.starts_s, words.ends_s, strict=True))
        assert list(words.starts_s) == sorted(words.starts_s)


async def test_at_double_speed_every_time_is_halved(aiohttp_server: Callable, connect: Connect) -> None:
    app = clip_app(ClipService(sentence_clip(), RATE, PATCH))
    normal = [
        m for m in await messages_of_one_utterance(await connect(await aiohttp_server(app))) if isinstance(m, Words)
    ]
    fast_stream = await connect(await aiohttp_server(clip_app(ClipService(sentence_clip(), RATE, PATCH))))
    fast = [m for m in await messages_of_one_utterance(fast_stream, speed=2.0) if isinstance(m, Words)]
    assert [w.words for w in fast] == [w.words for w in normal]
    for slow, quick in zip(normal, fast, strict=True):
        assert quick.starts_s == pytest.approx([t / 2 for t in slow.starts_s])
        assert quick.ends_s == pytest.approx([t / 2 for t in slow.ends_s])
