"""Estimated character and word timings of a spoken segment, from the audio actually produced for it.

VoxCPM does not align text to audio, so timings are estimates: ``estimate_alignment`` finds where the
segment's audio is speech (its first and last 10 ms frame within ``SPEECH_FLOOR_DB`` of the loudest
one: the leading and trailing silence the model made is not given to any character) and shares that
span among the characters by weight (``char_weight``: letters and digits take a full share, spaces
less, punctuation the pause it usually stands for). The estimate therefore moves with the audio: a
segment spoken slowly or with a long pause before it gets later, longer timings, and the last
character ends where the speech ends, never where the text alone would put it. Within the span the
split is proportional, not measured: a word's timing is right on average, not to the phoneme.

Word timings (``Alignment.words``) are the characters' timings gathered between whitespace; punctuation
stays with the word it follows, as the frameworks that consume them (Pipecat, LiveKit) split words too.
"""

from __future__ import annotations

import math
import unicodedata
from dataclasses import dataclass

import numpy as np

FRAME_S = 0.01
"""The frame over which loudness is measured when finding the speech span."""

SPEECH_FLOOR_DB = 35.0
"""A frame belongs to the speech span when its RMS is within this many dB of the loudest frame's."""

SILENCE_RMS = 1e-4
"""Frames quieter than this (about -80 dBFS) are silence whatever the loudest frame is."""

LETTER_WEIGHT = 1.0
SPACE_WEIGHT = 0.5
CLAUSE_PAUSE_WEIGHT = 2.0
"""``,;:`` and dashes: a short pause."""
SENTENCE_PAUSE_WEIGHT = 3.0
"""``.!?`` and their CJK forms: a longer pause."""
OTHER_WEIGHT = 0.3
"""Quotes, brackets and other symbols: mostly silent."""

_CLAUSE_MARKS = frozenset(",;:\u2013\u2014\u3001\uff0c\uff1b\uff1a")
_SENTENCE_MARKS = frozenset(".!?\u2026\u3002\uff01\uff1f")


def char_weight(char: str) -> float:
    """A character's share of the speech span, relative to a letter's."""
    if char.isalnum():
        return LETTER_WEIGHT
    if char.isspace():
        return SPACE_WEIGHT
    if char in _SENTENCE_MARKS:
        return SENTENCE_PAUSE_WEIGHT
    if char in _CLAUSE_MARKS:
        return CLAUSE_PAUSE_WEIGHT
    if unicodedata.category(char).startswith("M"):  # combining marks belong to the letter before them
        return 0.0
    return OTHER_WEIGHT


@dataclass(frozen=True)
class WordTiming:
    word: str
    start_s: float
    end_s: float


@dataclass(frozen=True)
class Alignment:
    """When each character of ``text`` is estimated to be spoken, in seconds from the segment's first sample."""

    text: str
    starts_s: tuple[float, ...]
    """One per character of ``text``; each character ends where the next one starts, the last at ``end_s``."""
    end_s: float
    """Where the speech ends (the audio may go on with silence to ``duration_s``)."""
    duration_s: float
    """The segment's whole audio."""

    def ends_s(self) -> tuple[float, ...]:
        return (*self.starts_s[1:], self.end_s) if self.starts_s else ()

    def words(self) -> list[WordTiming]:
        """The whitespace-separated words with the start of their first and the end of their last character."""
        words: list[WordTiming] = []
        ends = self.ends_s()
        start: int | None = None
        for index, char in enumerate(self.text + " "):
            if not char.isspace():
                start = index if start is None else start
            elif start is not None:
                words.append(WordTiming(self.text[start:index], self.starts_s[start], ends[index - 1]))
                start = None
        return words


class SpeechMeter:
    """A segment's loudness per ``FRAME_S`` frame, measured chunk by chunk as its audio is produced, so that a
    stream's timings need no copy of its audio: ``add`` each chunk, then ``span`` or ``alignment``."""

    def __init__(self, sample_rate: int) -> None:
        self.sample_rate = sample_rate
        self._frame = max(1, round(FRAME_S * sample_rate))
        self._rms: list[np.ndarray] = []
        self._carry = np.zeros(0, dtype=np.float64)
        """The samples after the last whole frame (a trailing part frame is never measured)."""
        self.samples = 0

    def add(self, chunk: np.ndarray) -> None:
        """Measure the next ``chunk`` (shape ``(samples,)``) of the segment's audio."""
        self.samples += chunk.size
        audio = np.concatenate([self._carry, chunk.astype(np.float64)])
        frames = audio.size // self._frame
        whole = audio[: frames * self._frame].reshape(frames, self._frame)
        self._rms.append(np.sqrt(np.square(whole).mean(axis=1)))
        self._carry = audio[frames * self._frame :]

    def span(self) -> tuple[float, float]:
        """(start, end) in seconds of the part that is not leading or trailing silence; all of it when it is
        silent throughout."""
        duration = self.samples / self.sample_rate
        rms = np.concatenate(self._rms) if self._rms else np.zeros(0)
        if rms.size == 0:
            return 0.0, duration
        floor = max(SILENCE_RMS, float(rms.max()) * 10 ** (-SPEECH_FLOOR_DB / 20))
        loud = np.flatnonzero(rms >= floor)
        if loud.size == 0:
            return 0.0, duration
        frame_s = self._frame / self.sample_rate
        return float(loud[0] * frame_s), min(duration, float((loud[-1] + 1) * frame_s))

    def alignment(self, text: str) -> Alignment:
        """Estimated timings of ``text``'s characters in the audio measured so far; see the module docstring."""
        start, end = self.span()
        weights = [char_weight(char) for char in text]
        total = math.fsum(weights)
        starts: list[float] = []
        done = 0.0
        for weight in weights:
            starts.append(start + (end - start) * (done / total if total else 0.0))
            done += weight
        return Alignment(text, tuple(starts), end if text else start, self.samples / self.sample_rate)


def speech_span(audio: np.ndarray, sample_rate: int) -> tuple[float, float]:
    """(start, end) in seconds of the part of ``audio`` (shape ``(samples,)``) that is not leading or trailing
    silence; all of it when it is silent throughout."""
    meter = SpeechMeter(sample_rate)
    meter.add(audio)
    return meter.span()


def estimate_alignment(text: str, audio: np.ndarray, sample_rate: int) -> Alignment:
    """Estimated timings of ``text``'s characters in ``audio`` (shape ``(samples,)``, the segment's audio as
    produced, at ``sample_rate``); see the module docstring."""
    meter = SpeechMeter(sample_rate)
    meter.add(audio)
    return meter.alignment(text)
