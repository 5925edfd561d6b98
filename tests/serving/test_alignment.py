"""``serving/speech/alignment.py``: character and word timings estimated from the audio a segment actually produced."""

from __future__ import annotations

import numpy as np
import pytest

from voxwire.serving.speech.alignment import (
    DEFAULT_SPEAKING_RATE,
    SETTLE_MARGIN_S,
    Alignment,
    SpeakingRate,
    SpeechMeter,
    WordTimer,
    WordTiming,
    char_weight,
)

RATE = 16000


def speech(lead_s: float, voiced_s: float, tail_s: float, rate: int = RATE) -> np.ndarray:
    """Silence, a voiced stretch (a 200 Hz tone, shape ``(samples,)``), silence."""
    voiced = 0.3 * np.sin(2 * np.pi * 200 * np.arange(round(voiced_s * rate)) / rate)
    return np.concatenate([np.zeros(round(lead_s * rate)), voiced, np.zeros(round(tail_s * rate))]).astype(np.float32)


def measured(audio: np.ndarray, rate: int = RATE) -> SpeechMeter:
    """A meter that has measured all of ``audio`` at once."""
    meter = SpeechMeter(rate)
    meter.add(audio)
    return meter


def estimate_alignment(text: str, audio: np.ndarray, rate: int = RATE) -> Alignment:
    return measured(audio, rate).alignment(text)


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
    assert measured(np.zeros(RATE, dtype=np.float32)).span() == (0.0, 1.0)
    assert measured(np.zeros(0, dtype=np.float32)).span() == (0.0, 0.0)
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


def test_characters_timed_from_their_words_keep_each_words_span_and_share_the_gaps() -> None:
    words = [WordTiming("Hi,", 0.1, 0.3), WordTiming("there.", 0.45, 1.0)]
    alignment = Alignment.of_words("Hi,  there.", words, duration_s=1.5)
    assert alignment.words() == words
    assert alignment.starts_s[3:5] == (0.3, pytest.approx(0.375)), "the two spaces share the pause"
    durations = [end - start for start, end in zip(alignment.starts_s, alignment.ends_s(), strict=True)]
    assert durations[2] > durations[1], "within a word the characters share it by weight: a comma is a pause"
    assert (alignment.end_s, alignment.duration_s) == (1.0, 1.5)


def test_characters_timed_from_the_words_of_a_whole_segment_are_its_measured_timings() -> None:
    audio = speech(0.2, 1.0, 0.3)
    timer = WordTimer("Hello there, world.", RATE, SpeakingRate())
    timer.meter.add(audio)  # all of it at once: no word settles before the end
    from_words = Alignment.of_words("Hello there, world.", timer.finish(learn=False), timer.meter.duration_s)
    measured_alignment = estimate_alignment("Hello there, world.", audio)
    assert from_words.starts_s == pytest.approx(measured_alignment.starts_s, abs=1e-9)
    assert (from_words.end_s, from_words.duration_s) == pytest.approx((measured_alignment.end_s, audio.size / RATE))


CHUNK = 2560
"""160 ms at 16 kHz: the engine's chunk."""
LONG = "The quick brown fox jumps over the lazy dog, and then it runs far away into the woods."


def timed_as_produced(
    text: str, audio: np.ndarray, rate: SpeakingRate, learn: bool = True
) -> list[tuple[float, list[WordTiming]]]:
    """(seconds of audio produced, the words given out then) for each chunk of ``audio`` and, last, ``finish``."""
    timer = WordTimer(text, RATE, rate)
    given = [
        ((start + CHUNK) / RATE if start + CHUNK < audio.size else audio.size / RATE, timer.add(audio[start:][:CHUNK]))
        for start in range(0, audio.size, CHUNK)
    ]
    return [*given, (audio.size / RATE, timer.finish(learn))]


def bursts(lead_s: float, spans: list[tuple[float, float]], tail_s: float) -> np.ndarray:
    """Silence, then tone bursts of (voiced, silent) seconds each (a word spoken and a pause), then silence."""
    parts = [np.zeros(round(lead_s * RATE))]
    for voiced_s, pause_s in spans:
        parts += [speech(0.0, voiced_s, pause_s)]
    return np.concatenate([*parts, np.zeros(round(tail_s * RATE))]).astype(np.float32)


def test_words_are_given_out_once_each_in_order_before_the_segment_ends() -> None:
    audio = bursts(0.3, [(1.5, 0.1), (2.0, 0.1), (2.5, 0.0)], 0.4)
    given = timed_as_produced(LONG, audio, SpeakingRate())
    words = [word for _, part in given for word in part]
    assert [word.word for word in words] == LONG.split()
    assert len(given[-1][1]) < len(words) / 2, "most words were settled while the audio was still produced"
    for produced_s, part in given[:-1]:  # before the end: each word long produced, never the last word
        assert all(word.end_s + SETTLE_MARGIN_S <= produced_s + 1e-9 for word in part)
    assert words[-1] in given[-1][1]
    starts, ends = [w.start_s for w in words], [w.end_s for w in words]
    assert starts[0] == pytest.approx(0.3, abs=0.011), "the first word starts where the speech does"
    assert all(a <= b for a, b in zip(starts, ends, strict=True))
    assert all(end <= next_start for end, next_start in zip(ends, starts[1:], strict=False)), "times never go backwards"
    assert ends[-1] == pytest.approx(audio.size / RATE - 0.4, abs=0.011), "the last word ends with the speech"


def test_early_words_follow_the_default_rate_from_the_speech_start() -> None:
    audio = speech(0.5, 5.0, 0.0)
    given = timed_as_produced("One two three four five six seven eight nine ten.", audio, SpeakingRate())
    first = next(part for _, part in given if part)[0]
    assert first.word == "One"
    assert first.start_s == pytest.approx(0.5, abs=0.011)
    assert first.end_s - first.start_s == pytest.approx(3 / DEFAULT_SPEAKING_RATE)  # three letters


def test_nothing_is_settled_during_leading_silence_or_in_a_short_segment() -> None:
    timer = WordTimer("Well then, we begin.", RATE, SpeakingRate())
    assert timer.add(np.zeros(RATE * 2, dtype=np.float32)) == []
    given = timed_as_produced("Hi there.", speech(0.1, 0.3, 0.0), SpeakingRate())  # "Hi" settles at 0.55 s
    assert [word.word for word in given[-1][1]] == ["Hi", "there."] and not any(part for _, part in given[:-1])


def test_a_segment_with_nothing_settled_early_is_timed_as_the_whole_audio_is() -> None:
    audio = speech(0.2, 0.4, 0.0)  # "Hello" would settle at 0.89 s
    given = timed_as_produced("Hello there.", audio, SpeakingRate())
    assert not any(part for _, part in given[:-1])
    assert given[-1][1] == estimate_alignment("Hello there.", audio, RATE).words()


def test_the_rate_learned_from_a_previous_segment_times_the_next_one() -> None:
    rate = SpeakingRate()
    first_text = "A slow sentence comes first, spoken at half the usual pace."
    weight = sum(char_weight(char) for char in first_text)
    slow_s = 2 * weight / DEFAULT_SPEAKING_RATE
    timed_as_produced(first_text, speech(0.2, slow_s, 0.2), rate)
    assert rate.per_s == pytest.approx(DEFAULT_SPEAKING_RATE / 2, rel=0.02)

    second = speech(0.3, 2 * sum(char_weight(c) for c in LONG) / DEFAULT_SPEAKING_RATE, 0.0)
    learned = [word for _, part in timed_as_produced(LONG, second, rate)[:-1] for word in part]
    fresh = [word for _, part in timed_as_produced(LONG, second, SpeakingRate())[:-1] for word in part]
    assert learned and fresh
    # at the learned (half) pace each early word ends twice as far from the speech start
    for slow, quick in zip(learned, fresh, strict=False):
        assert slow.word == quick.word
        assert slow.end_s - 0.3 == pytest.approx(2 * (quick.end_s - 0.3), rel=0.05)
    # and the learned pace is the one this audio has: the early words land where the whole audio's split puts them
    whole = estimate_alignment(LONG, second, RATE).words()
    assert [w.end_s for w in learned] == pytest.approx([w.end_s for w in whole[: len(learned)]], abs=0.02)
    assert fresh[5].end_s < whole[5].end_s - 0.5


def test_a_segment_cut_short_teaches_no_rate() -> None:
    rate = SpeakingRate()
    timed_as_produced("A long sentence cut at its length cap.", speech(0.0, 9.0, 0.0), rate, learn=False)
    assert rate.per_s == DEFAULT_SPEAKING_RATE


def test_when_the_speech_ends_before_the_settled_words_the_rest_fill_the_audio_left() -> None:
    """A rate far too fast settles words past where the speech really ends: the rest still go forwards, and end
    within the audio."""
    rate = SpeakingRate()
    rate.learn(1000.0, 1.0)
    audio = speech(0.0, 0.5, 1.5)
    given = timed_as_produced(LONG, audio, rate, learn=False)
    words = [word for _, part in given for word in part]
    assert [word.word for word in words] == LONG.split()
    ends = [word.end_s for word in words]
    assert ends == sorted(ends) and ends[-1] <= audio.size / RATE
    assert all(word.start_s <= word.end_s for word in words)
