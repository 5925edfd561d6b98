"""Speaking speed: a streaming, pitch-preserving tempo change through FFmpeg's ``atempo`` filter (PyAV).

``StreamTempo`` changes the tempo of float32 mono chunks as they come: the output of any chunking is the
output of the whole signal at once, and once ``flush``-ed it lasts exactly ``round(n / speed)`` samples
for ``n`` samples in. ``audio/formats.py`` puts it in front of an encoder for any speed but 1.0.

One ``atempo`` instance takes a factor in [0.5, 2.0]; a speed beyond that is a chain of instances whose
factors multiply to it (0.25 is 0.5 x 0.5, 4.0 is 2.0 x 2.0).
"""

from __future__ import annotations

from fractions import Fraction

import av
import numpy as np
from av.filter import Graph

from voxwire.audio.pcm import as_mono_float32
from voxwire.protocol.wire import MAX_SPEED, MIN_SPEED

_ATEMPO_MIN, _ATEMPO_MAX = 0.5, 2.0
"""The factor one ``atempo`` instance takes."""

_FIRST_PUSH_S = 0.05
"""Input held back before the filter gets its first frame: ``atempo`` starts differently on a first frame
shorter than its window (about 20 ms), which would make the output depend on the chunking."""

_FLUSH_PADDING_S = 0.2
"""Silence pushed after the last input at ``flush``: ``atempo`` keeps its last window back at end of stream,
and this pushes it out (the excess is then cut, so the output has the exact length)."""


def atempo_factors(speed: float) -> list[float]:
    """The ``atempo`` factors, each in [0.5, 2.0], whose product is ``speed``."""
    if not MIN_SPEED <= speed <= MAX_SPEED:
        raise ValueError(f"speed={speed} is invalid: must be in [{MIN_SPEED}, {MAX_SPEED}]")
    factors = []
    rest = speed
    while not _ATEMPO_MIN <= rest <= _ATEMPO_MAX:
        step = _ATEMPO_MIN if rest < _ATEMPO_MIN else _ATEMPO_MAX
        factors.append(step)
        rest /= step
    return [*factors, rest]


class StreamTempo:
    """float32 mono in at ``sample_rate``, the same audio ``speed`` times faster out, at the same pitch."""

    def __init__(self, sample_rate: int, speed: float) -> None:
        self.sample_rate = sample_rate
        self.speed = speed
        self._graph = Graph()
        node = self._graph.add_abuffer(
            format="flt", sample_rate=sample_rate, layout="mono", time_base=Fraction(1, sample_rate)
        )
        for factor in atempo_factors(speed):
            stage = self._graph.add("atempo", repr(factor))
            node.link_to(stage)
            node = stage
        sink = self._graph.add("abuffersink")
        node.link_to(sink)
        self._graph.configure()
        self._samples_in = 0
        """Samples of real input (not the flush padding)."""
        self._held: np.ndarray | None = np.zeros(0, dtype=np.float32)
        """Input before the filter's first frame (``_FIRST_PUSH_S``); None once that frame is pushed."""
        self._samples_out = 0
        self._pts = 0
        self._flushed = False

    def process(self, chunk: np.ndarray) -> np.ndarray:
        """The tempo-changed audio ready after ``chunk`` (the filter holds back about one window)."""
        if self._flushed:
            raise RuntimeError("tempo stage already flushed")
        samples = as_mono_float32(chunk)
        self._samples_in += samples.size
        if self._held is not None:
            samples = np.concatenate([self._held, samples])
            if samples.size < _FIRST_PUSH_S * self.sample_rate:
                self._held = samples
                return np.zeros(0, dtype=np.float32)
            self._held = None
        if samples.size:
            self._push(samples)
        return self._pull()

    def flush(self) -> np.ndarray:
        """The rest, cut so that the whole output lasts ``round(samples in / speed)``; no use afterwards."""
        if self._flushed:
            raise RuntimeError("tempo stage already flushed")
        self._flushed = True
        padding = np.zeros(round(_FLUSH_PADDING_S * self.sample_rate), dtype=np.float32)
        self._push(padding if self._held is None else np.concatenate([self._held, padding]))
        self._graph.push(None)
        rest = self._pull()
        wanted = round(self._samples_in / self.speed)
        # The padding is silence past the end: keep only what the real input stretches to.
        return rest[: max(0, wanted - (self._samples_out - rest.size))]

    def _push(self, samples: np.ndarray) -> None:
        frame = av.AudioFrame.from_ndarray(samples[np.newaxis, :], format="flt", layout="mono")
        frame.sample_rate = self.sample_rate
        frame.pts = self._pts
        self._pts += samples.size
        self._graph.push(frame)

    def _pull(self) -> np.ndarray:
        blocks = []
        while True:
            try:
                frame = self._graph.pull()
            except (BlockingIOError, EOFError):  # PyAV's: nothing more now / the stream has ended
                break
            blocks.append(frame.to_ndarray()[0].astype(np.float32, copy=False))
        out = np.concatenate(blocks) if blocks else np.zeros(0, dtype=np.float32)
        self._samples_out += out.size
        return out
