"""Word timings on ``/v1/tts/stream``: ``words`` messages time each sentence's words, in parts as its audio is
produced (each after the frames it times, a long sentence's first words before its last frame), estimated from
that audio (its leading and trailing silence belong to no word), on the utterance's timeline
(``segment.start_sample``), after any ``speed``."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from voxwire.protocol.wire import AudioFrame, Done, End, Ready, Segment, ServerMessage, Start, Text, Words
from voxwire.serving.speech.alignment import DEFAULT_SPEAKING_RATE, char_weight

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


async def messages_of_one_utterance(
    stream: StreamClient, text: str = TEXT, **settings: object
) -> list[ServerMessage | AudioFrame]:
    await stream.send(Start(format="pcm_f32le", **settings))  # type: ignore[arg-type]
    await stream.expect(Ready)
    await stream.send(Text(text))
    await stream.send(End())
    received: list[ServerMessage | AudioFrame] = []
    while not received or not isinstance(received[-1], Done):
        received.append(await stream.receive())
    return received


def samples_before(received: list[ServerMessage | AudioFrame], start: int, stop: int) -> int:
    """The ``pcm_f32le`` samples of the audio frames among ``received[start:stop]``."""
    frames = [m for m in received[start:stop] if isinstance(m, AudioFrame)]
    return sum(len(packet) // 4 for frame in frames for packet in frame.packets)


def check_words_of_each_sentence(received: list[ServerMessage | AudioFrame], clip_samples: int) -> list[Words]:
    """Each sentence's ``words`` messages: together its text's words once each, in order, every time
    non-decreasing, within the sentence's audio and after the frames it times. The sentence's first part."""
    firsts: list[Words] = []
    for segment in (m for m in received if isinstance(m, Segment)):
        begins, at = segment.start_sample / RATE, received.index(segment)
        parts = [(i, m) for i, m in enumerate(received) if isinstance(m, Words) and m.index == segment.index]
        assert all(part.utterance == segment.utterance for _, part in parts)
        assert [word for _, part in parts for word in part.words] == segment.text.split()
        times = [t for _, part in parts for pair in zip(part.starts_s, part.ends_s, strict=True) for t in pair]
        assert times == sorted(times) and begins <= times[0] and times[-1] <= begins + clip_samples / RATE
        for i, part in parts:
            produced = samples_before(received, at, i)
            assert part.ends_s[-1] <= begins + produced / RATE, "a word was sent before its audio"
        assert samples_before(received, at, parts[-1][0]) == clip_samples, "the last part follows every frame"
        firsts.append(parts[0][1])
    return firsts


async def test_each_sentence_times_its_words_within_its_speech_after_its_frames(
    aiohttp_server: Callable, connect: Connect
) -> None:
    stream = await connect(await aiohttp_server(clip_app(ClipService(sentence_clip(), RATE, PATCH))))
    received = await messages_of_one_utterance(stream)
    check_words_of_each_sentence(received, sentence_clip().size)
    for segment in (m for m in received if isinstance(m, Segment)):
        words = [m for m in received if isinstance(m, Words) and m.index == segment.index]
        begins = segment.start_sample / RATE
        # The speech span, not the silence around it: within one 10 ms loudness frame.
        assert words[0].starts_s[0] == pytest.approx(begins + SILENCE_S, abs=0.011)
        assert words[-1].ends_s[-1] == pytest.approx(begins + SILENCE_S + SPEECH_S, abs=0.011)


LONG_TEXT = (
    "This first sentence goes on for a good while, so that its listener hears many words before it ends. "
    "The second one is just as long, and its words are timed at the pace the first sentence was spoken."
)


def long_clip(speech_s: float) -> np.ndarray:
    """A sentence of ``speech_s`` seconds of tone between 0.2 s of silence on each side."""
    t = np.arange(round(speech_s * RATE)) / RATE
    quiet = np.zeros(round(0.2 * RATE))
    return np.concatenate([quiet, 0.5 * np.sin(2 * np.pi * 180 * t), quiet]).astype(np.float32)


async def test_a_long_sentence_times_its_first_words_before_its_last_frame(
    aiohttp_server: Callable, connect: Connect
) -> None:
    clip = long_clip(6.0)
    stream = await connect(await aiohttp_server(clip_app(ClipService(clip, RATE, PATCH))))
    received = await messages_of_one_utterance(stream, LONG_TEXT)
    firsts = check_words_of_each_sentence(received, clip.size)
    segments = [m for m in received if isinstance(m, Segment)]
    assert len(segments) == 2
    for segment, first in zip(segments, firsts, strict=True):
        sentence_audio = samples_before(received, received.index(segment), received.index(first))
        assert sentence_audio < clip.size / 2, "the first words came in the sentence's first half"
    # The second sentence is timed at the pace the first one was spoken at (its text's weight in 6 s of speech),
    # not at the default pace.
    second = [m for m in received if isinstance(m, Words) and m.index == 1]
    first_word_s = second[0].ends_s[0] - second[0].starts_s[0]
    learned, default = 6.0 * weight_of("The") / weight_of(segments[0].text), weight_of("The") / DEFAULT_SPEAKING_RATE
    assert first_word_s == pytest.approx(learned, abs=0.005) and abs(learned - default) > 0.03


def weight_of(text: str) -> float:
    return sum(char_weight(char) for char in text)


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
