"""Stateful streaming resampler for chunked model output.

Resampling each chunk on its own would restart the filter at every chunk boundary and
click; a soxr stream keeps the filter history, so the output is the same whatever the
chunking (soxr's stream output is bit-identical to resampling the whole signal at once).
"""

from __future__ import annotations

import numpy as np

from voxwire.audio.backend import audio_backend
from voxwire.audio.pcm import as_mono_float32

_EMPTY = np.zeros(0, dtype=np.float32)


class StreamResampler:
    """float32 mono in at ``input_rate``, float32 mono out at ``output_rate``.

    soxr holds back about its filter delay (504 samples at 48 kHz for 44.1 -> 48 kHz, HQ) until
    more input arrives; ``flush`` releases it, and the total output is then
    ``floor(n_in * output_rate / input_rate + 1/2)`` samples (halves round up). Equal rates pass chunks through.
    """

    def __init__(self, input_rate: int, output_rate: int, *, quality: str = "HQ") -> None:
        if input_rate <= 0 or output_rate <= 0:
            raise ValueError(f"sample rates must be positive, got {input_rate} -> {output_rate}")
        self.input_rate = input_rate
        self.output_rate = output_rate
        self._stream = (
            None
            if input_rate == output_rate
            else audio_backend("soxr").ResampleStream(input_rate, output_rate, 1, dtype="float32", quality=quality)
        )
        self._flushed = False

    def process(self, chunk: np.ndarray) -> np.ndarray:
        """Resample one chunk; the result may be shorter or longer than the rate ratio implies."""
        self._check_open()
        samples = as_mono_float32(chunk)
        if self._stream is None:
            return samples
        return self._stream.resample_chunk(samples)

    def flush(self) -> np.ndarray:
        """Release the samples held in the filter; the resampler cannot be used afterwards."""
        self._check_open()
        self._flushed = True
        if self._stream is None:
            return _EMPTY
        return self._stream.resample_chunk(_EMPTY, last=True)

    def _check_open(self) -> None:
        if self._flushed:
            raise RuntimeError("resampler already flushed")
