"""Estimated character and word timings of a spoken segment, from the audio actually produced for it.

VoxCPM does not align text to audio, so timings are estimates: ``SpeechMeter.alignment`` finds where the
segment's audio is speech (its first and last 10 ms frame within ``SPEECH_FLOOR_DB`` of the loudest
one: the leading and trailing silence the model made is not given to any character) and shares that
span among the characters by weight (``char_weight``: letters and digits take a full share, spaces
less, punctuation the pause it usually stands for). The estimate therefore moves with the audio: a
segment spoken slowly or with a long pause before it gets later, longer timings, and the last
character ends where the speech ends, never where the text alone would put it. Within the span the
split is proportional, not measured: a word's timing is right on average, not to the phoneme.

Word timings (``Alignment.words``) are the characters' timings gathered between whitespace; punctuation
stays with the word it follows, as the frameworks that consume them (Pipecat, LiveKit) split words too.

While a segment is still being produced its words can be timed before its end (``WordTimer``): from the speech
start found so far and the utterance's speaking rate (``SpeakingRate``: weight per second of speech, measured on
its earlier segments, ``DEFAULT_SPEAKING_RATE`` before any), a word is settled once the audio produced runs
``SETTLE_MARGIN_S`` past its estimated end; at the segment's end the words left share the rest of its speech
span by weight. These are estimates from the audio produced so far too (the speech start, the rate, how much
audio exists), never from the text alone, and an early word's timing does not move once given out.
"""

from __future__ import annotations

import itertools
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

DEFAULT_SPEAKING_RATE = 13.0
"""Weight units (``char_weight``) per second of speech for an utterance's first segment, before it has a spoken
one to measure: about 150 words a minute of English (a word of five letters, a space and its share of the
punctuation weighs about 5.5), the usual pace of read prose. It is an assumption about VoxCPM's voices, not a
measurement of them; from the second segment on the pace measured on the utterance replaces it. (CJK text has no
spaces, so its sentence is one word, timed at the sentence's end.)"""

SETTLE_MARGIN_S = 0.3
"""A word is given out once the audio produced runs this far past its estimated end, so that a speaking rate off
by a fifth over a sentence's first seconds still finds the word's audio already produced."""

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
        ends = self.ends_s()
        return [WordTiming(self.text[a:b], self.starts_s[a], ends[b - 1]) for a, b in word_spans(self.text)]

    @classmethod
    def of_words(cls, text: str, words: list[WordTiming], duration_s: float) -> Alignment:
        """``text``'s character timings from its words' (``WordTimer``'s, one per ``word_spans`` word, in order):
        a word's characters share its span by weight, the characters between two words the gap between them, and
        the speech ends where the last word does. ``duration_s``: the segment's whole audio."""
        starts: list[float] = []
        position, at = 0, words[0].start_s if words else 0.0
        for (first, past), word in zip(word_spans(text), words, strict=True):
            starts += _shared(text[position:first], at, word.start_s)  # the gap before it
            starts += _shared(text[first:past], word.start_s, word.end_s)
            position, at = past, word.end_s
        starts += _shared(text[position:], at, at)
        return cls(text, tuple(starts), at, duration_s)


def _shared(text: str, start: float, end: float) -> list[float]:
    """Where each character of ``text`` starts when they share ``start`` to ``end`` by weight (``char_weight``)."""
    weights = [char_weight(char) for char in text]
    total = math.fsum(weights)
    starts: list[float] = []
    done = 0.0
    for weight in weights:
        starts.append(start + (end - start) * (done / total if total else 0.0))
        done += weight
    return starts


def word_spans(text: str) -> list[tuple[int, int]]:
    """(first, past the last) character index of each of ``text``'s whitespace-separated words."""
    spans: list[tuple[int, int]] = []
    start: int | None = None
    for index, char in enumerate(text + " "):
        if not char.isspace():
            start = index if start is None else start
        elif start is not None:
            spans.append((start, index))
            start = None
    return spans


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

    @property
    def duration_s(self) -> float:
        """The audio measured so far."""
        return self.samples / self.sample_rate

    def span(self) -> tuple[float, float]:
        """(start, end) in seconds of the part that is not leading or trailing silence; all of it when it is
        silent throughout."""
        loud = self._loud()
        if loud.size == 0:
            return 0.0, self.duration_s
        frame_s = self._frame / self.sample_rate
        return float(loud[0] * frame_s), min(self.duration_s, float((loud[-1] + 1) * frame_s))

    def speech_start(self) -> float | None:
        """Where the speech starts in the audio measured so far (as ``span`` finds it); None while all of it is
        silence. A louder frame later may move it later, as the floor is relative to the loudest frame."""
        loud = self._loud()
        return float(loud[0] * self._frame / self.sample_rate) if loud.size else None

    def _loud(self) -> np.ndarray:
        """The indices of the frames within ``SPEECH_FLOOR_DB`` of the loudest one and above ``SILENCE_RMS``."""
        rms = np.concatenate(self._rms) if self._rms else np.zeros(0)
        if rms.size == 0:
            return np.zeros(0, dtype=np.int64)
        floor = max(SILENCE_RMS, float(rms.max()) * 10 ** (-SPEECH_FLOOR_DB / 20))
        return np.flatnonzero(rms >= floor)

    def alignment(self, text: str) -> Alignment:
        """Estimated timings of ``text``'s characters in the audio measured so far; see the module docstring."""
        start, end = self.span()
        return Alignment(text, tuple(_shared(text, start, end)), end if text else start, self.duration_s)


class SpeakingRate:
    """How fast an utterance is spoken, in weight units (``char_weight``) per second of speech: measured over the
    speech spans of its segments so far (``learn``), ``DEFAULT_SPEAKING_RATE`` before the first one."""

    def __init__(self) -> None:
        self._weight = 0.0
        self._seconds = 0.0

    @property
    def per_s(self) -> float:
        return self._weight / self._seconds if self._seconds > 0 else DEFAULT_SPEAKING_RATE

    def learn(self, weight: float, seconds: float) -> None:
        """A segment whose text weighs ``weight`` was spoken in a speech span of ``seconds``."""
        if weight > 0 and seconds > 0:
            self._weight += weight
            self._seconds += seconds


class WordTimer:
    """A segment's word timings while its audio is produced: ``add`` each chunk and pass on the words it returns
    (the ones now settled), then ``finish`` for the rest. Times are seconds from the segment's first sample.

    A word is settled when the audio produced runs ``SETTLE_MARGIN_S`` past its estimated end, estimated from the
    speech start found so far and the utterance's ``SpeakingRate`` (its weight before the word's end over the
    rate). The last word waits for ``finish``, where the words left share the rest of the speech span by weight,
    from the last settled word's end to the speech's end (or, when the speech ended before that, to the end of the
    audio). Times never go backwards and never past the audio produced; with no word settled early, ``finish``
    times the segment exactly as ``SpeechMeter.alignment`` does."""

    def __init__(self, text: str, sample_rate: int, rate: SpeakingRate) -> None:
        self.text = text
        self.meter = SpeechMeter(sample_rate)
        self._rate = rate
        self._spans = word_spans(text)
        self._before = list(itertools.accumulate((char_weight(char) for char in text), initial=0.0))
        """``_before[i]``: the weight of ``text[:i]``."""
        self._settled = 0
        """How many words have been given out."""
        self._start: float | None = None
        """The speech start the settled words were timed from (fixed once one is settled)."""
        self._cursor = 0.0
        """Where the last settled word ends."""

    def add(self, chunk: np.ndarray) -> list[WordTiming]:
        """Measure the next ``chunk`` (shape ``(samples,)``); the words it settles, in order (often none)."""
        self.meter.add(chunk)
        start = self._start if self._start is not None else self.meter.speech_start()
        if start is None:  # silence so far: nothing is spoken yet
            return []
        per_s = self._rate.per_s
        settled: list[WordTiming] = []
        while self._settled < len(self._spans) - 1:
            first, past = self._spans[self._settled]
            end = start + self._before[past] / per_s
            if end + SETTLE_MARGIN_S > self.meter.duration_s:
                break
            settled.append(WordTiming(self.text[first:past], start + self._before[first] / per_s, end))
            self._settled += 1
        if settled:
            self._start, self._cursor = start, settled[-1].end_s
        return settled

    def finish(self, learn: bool) -> list[WordTiming]:
        """The segment's audio is complete: its words not yet settled. ``learn``: its audio says its whole text (it
        was not cut short or long), so its speech span teaches the utterance's speaking rate."""
        start, end = self.meter.span()
        total = self._before[-1]
        if learn:
            self._rate.learn(total, end - start)
        if self._start is None:
            from_s, from_weight = start, 0.0
        else:
            from_s, from_weight = self._cursor, self._before[self._spans[self._settled - 1][1]]
        to_s = end if end > from_s else self.meter.duration_s
        share = (to_s - from_s) / (total - from_weight) if total > from_weight else 0.0

        def at(weight: float) -> float:
            return min(to_s, from_s + (weight - from_weight) * share)  # no rounding past the span's end

        rest = self._spans[self._settled :]
        self._settled = len(self._spans)
        return [WordTiming(self.text[a:b], at(self._before[a]), at(self._before[b])) for a, b in rest]
