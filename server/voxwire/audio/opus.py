"""Per-session Opus encoder for chunked model output (libopus through ``voxwire.audio.libopus``).

One encoder lives for a whole stream so that its state (prediction, overlap, the
resampler's filter) carries across chunks: a chunked stream produces exactly the packets
that encoding the concatenated audio would. Chunks are cut into 20 ms frames and the
remainder waits for the next chunk. Rates Opus cannot code (44.1 kHz) go through a
stateful resampler to 48 kHz first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from voxwire.audio.libopus import (
    APPLICATIONS,
    GET_BITRATE,
    GET_COMPLEXITY,
    GET_LOOKAHEAD,
    SET_BITRATE,
    SET_COMPLEXITY,
    MonoEncoder,
)
from voxwire.audio.resample import StreamResampler

OPUS_RATES = (8000, 12000, 16000, 24000, 48000)
GRANULE_RATE = 48000
"""Ogg Opus counts pre-skip and granule positions at 48 kHz whatever the coding rate."""

FRAME_MS = 20
DEFAULT_BITRATE = 32000
"""Mono speech is transparent-ish at 24-32 kb/s; the tests measure the quality at this rate."""

DEFAULT_COMPLEXITY = 6
"""Measured on speech (``scripts/bench_opus.py``, docs/performance.md): complexity 7 and up costs ~5x the CPU of 6
(SILK's higher-complexity analysis) for ~2 dB of spectral SNR at 32 kb/s; 0-6 cost about the same."""
_MAX_PACKET_BYTES = 1275
"""Largest single-frame Opus packet (RFC 6716 section 3.2.1)."""


@dataclass(frozen=True, slots=True)
class OpusSettings:
    """How every Opus stream of a server is coded."""

    bitrate: int = DEFAULT_BITRATE
    """Bits per second (libopus accepts 500 to 512000)."""
    complexity: int = DEFAULT_COMPLEXITY
    """0 (cheapest) to 10 (best): the encoder's CPU/quality trade-off."""

    def __post_init__(self) -> None:
        if not _is_int(self.bitrate) or not 500 <= self.bitrate <= 512_000:
            raise ValueError(f"Opus bitrate={self.bitrate!r} is invalid: must be an int in [500, 512000]")
        if not _is_int(self.complexity) or not 0 <= self.complexity <= 10:
            raise ValueError(f"Opus complexity={self.complexity!r} is invalid: must be an int in [0, 10]")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def opus_rate_for(input_rate: int) -> int:
    """Code at the model rate when Opus supports it (no resampling), else at 48 kHz."""
    return input_rate if input_rate in OPUS_RATES else GRANULE_RATE


class OpusEncoder:
    """float32 chunks at ``input_rate`` in, raw Opus packets (one per 20 ms frame) out."""

    def __init__(
        self,
        input_rate: int,
        *,
        opus_rate: int | None = None,
        bitrate: int = DEFAULT_BITRATE,
        complexity: int = DEFAULT_COMPLEXITY,
        application: str = "audio",
    ) -> None:
        self.input_rate = input_rate
        self.sample_rate = opus_rate_for(input_rate) if opus_rate is None else opus_rate
        if self.sample_rate not in OPUS_RATES:
            raise ValueError(f"Opus codes at {OPUS_RATES} Hz, not {self.sample_rate}")
        if application not in APPLICATIONS:
            raise ValueError(f"application must be one of {tuple(APPLICATIONS)}, got {application!r}")
        self.frame_size = self.sample_rate * FRAME_MS // 1000
        self._resampler = StreamResampler(input_rate, self.sample_rate)
        self._encoder = MonoEncoder(self.sample_rate, application, _MAX_PACKET_BYTES)
        self._encoder.set(SET_BITRATE, bitrate)
        self._encoder.set(SET_COMPLEXITY, complexity)
        self._pending = np.zeros(0, dtype=np.float32)
        self._frames_encoded = 0
        self._real_samples = 0
        self._finished = False

    @property
    def bitrate(self) -> int:
        return self._encoder.get(GET_BITRATE)

    @property
    def complexity(self) -> int:
        return self._encoder.get(GET_COMPLEXITY)

    @property
    def lookahead(self) -> int:
        """Encoder delay in samples at ``sample_rate`` (libopus OPUS_GET_LOOKAHEAD)."""
        return self._encoder.get(GET_LOOKAHEAD)

    @property
    def pre_skip(self) -> int:
        """Samples at 48 kHz a decoder must drop so its output lines up with the input."""
        return self.lookahead * self._granule_scale

    @property
    def real_samples(self) -> int:
        """Samples of actual audio (at ``sample_rate``) taken in so far, excluding end padding."""
        return self._real_samples

    @property
    def real_samples_48k(self) -> int:
        """``real_samples`` at 48 kHz: the playable length an Ogg end-trimmed stream must claim."""
        return self._real_samples * self._granule_scale

    @property
    def frame_samples_48k(self) -> int:
        return self.frame_size * self._granule_scale

    @property
    def _granule_scale(self) -> int:
        return GRANULE_RATE // self.sample_rate

    def encode(self, chunk: np.ndarray) -> list[bytes]:
        """Encode every complete 20 ms frame now available; the remainder waits for the next chunk."""
        self._check_open()
        return self._encode_frames(self._resampler.process(chunk))

    def finish(self) -> list[bytes]:
        """Drain the resampler, then pad with silence so the decoder's delayed output reaches the last real sample."""
        self._check_open()
        self._finished = True
        packets = self._encode_frames(self._resampler.flush())
        needed = self._real_samples + self.lookahead
        padded = math.ceil(needed / self.frame_size) * self.frame_size
        padding = padded - self._frames_encoded * self.frame_size - self._pending.size
        return packets + self._encode_frames(np.zeros(padding, dtype=np.float32), real=False)

    def _encode_frames(self, samples: np.ndarray, *, real: bool = True) -> list[bytes]:
        if real:
            self._real_samples += samples.size
        buffered = np.concatenate((self._pending, samples)) if self._pending.size else samples
        n_frames = buffered.size // self.frame_size
        cut = n_frames * self.frame_size
        self._pending = buffered[cut:].copy()
        self._frames_encoded += n_frames
        return [self._encoder.encode_float(frame) for frame in buffered[:cut].reshape(n_frames, self.frame_size)]

    def _check_open(self) -> None:
        if self._finished:
            raise RuntimeError("Opus encoder already finished")
