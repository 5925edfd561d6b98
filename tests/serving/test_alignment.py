"""``serving/alignment.py``: character and word timings estimated from the audio a segment actually produced."""

from __future__ import annotations

import numpy as np
import pytest

from voxwire.serving.alignment import SpeechMeter, char_weight, estimate_alignment, speech_span

RATE = 16000


def speech(lead_s: float, voiced_s: float, tail_s: float, rate: int = RATE) -> np.ndarray:
    """Silence, a voiced stretch (a 200 Hz tone, shape ``(samples,)``), silence."""
    voiced = 0.3 * np.sin(2 * np.pi * 200 * np.arange(round(voiced_s * rate)) / rate)
    return np.concatenate([np.zeros(round(lead_s * rate)), voiced, np.zeros(round(tail_s * rate))]).astype(np.float32)


def test_the_characters_share_the_speech_and_not_the_silence_around_it() -> None:
    alignment = estimate_alignment("Hi there.", speech(0.3, 1.0, 0.5), RATE)
    assert alignment.duration_s == pytest.approx(1.8)
    assert alignment.starts_s[0] == pytest.approx(0.3, abs=0.011)
    assert alignment.end_s == pytest.approx(1.3, abs=0.011)
    assert list(alignment.starts_s) == sorted(alignment.starts_s)
    hi, there = alignment.words()
    assert (hi.word, there.word) == ("Hi", "there.")
    assert hi.start_s == alignment.starts_s[0] and there.end_s == alignment.end_s
    assert hi.end_s < there.start_s  # the space between them
    # "there." has five letters and a full stop against two letters: most of the speech is its
    assert there.end_s - there.start_s > 2 * (hi.end_s - hi.start_s)


def test_the_same_text_spoken_longer_gets_later_longer_timings() -> None:
    short = estimate_alignment("One two three.", speech(0.1, 0.9, 0.0), RATE)
    slow = estimate_alignment("One two three.", speech(0.4, 1.8, 0.0), RATE)
    for fast_word, slow_word in zip(short.words(), slow.words(), strict=True):
        assert slow_word.start_s > fast_word.start_s
        assert slow_word.end_s - slow_word.start_s == pytest.approx(2 * (fast_word.end_s - fast_word.start_s), rel=0.05)


def test_pauses_weigh_more_than_letters_and_spaces_less() -> None:
    assert char_weight(".") > char_weight(",") > char_weight("a") > char_weight(" ") > 0
    assert char_weight("\u3002") == char_weight(".")  # the CJK full stop
    assert char_weight("\u0301") == 0  # a combining accent belongs to its letter


def test_silent_or_empty_audio_spreads_over_all_of_it() -> None:
    assert speech_span(np.zeros(RATE, dtype=np.float32), RATE) == (0.0, 1.0)
    assert speech_span(np.zeros(0, dtype=np.float32), RATE) == (0.0, 0.0)
    alignment = estimate_alignment("Hello", np.zeros(RATE // 2, dtype=np.float32), RATE)
    assert alignment.starts_s[0] == 0.0 and alignment.end_s == pytest.approx(0.5)


def test_text_without_words() -> None:
    alignment = estimate_alignment("", speech(0.0, 0.5, 0.0), RATE)
    assert alignment.starts_s == () and alignment.words() == []


def test_timings_measured_chunk_by_chunk_equal_those_of_the_whole_audio() -> None:
    rate = 48000
    rng = np.random.default_rng(0)
    audio = np.concatenate([np.zeros(3000), rng.normal(0, 0.3, 40000), np.zeros(9000)]).astype(np.float32)
    meter = SpeechMeter(rate)
    for start in range(0, audio.size, 7680):  # the engine's 160 ms chunks: frames straddle chunk boundaries
        meter.add(audio[start : start + 7680])
    assert meter.alignment("Hello there, world.") == estimate_alignment("Hello there, world.", audio, rate)
    assert meter.span() == pytest.approx((3000 / rate, 43000 / rate), abs=0.011)
