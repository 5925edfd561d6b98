"""MP3 as a stream of MPEG audio frames (LAME through PyAV).

MPEG audio frames are self-synchronising, so the packets need no container: their concatenation
is an ``.mp3`` file that any player, ``ffprobe`` or browser reads, and a client can start
decoding at the first frame. There is no Xing/LAME header (it needs the length); at a constant
bit rate the duration still follows from the size.
"""

from __future__ import annotations

import numpy as np

from voxwire.audio.codec import PacketEncoder

MP3_BITRATE = 128_000
"""Constant bit rate: transparent for 24-48 kHz mono speech, and the duration is exact from the size."""

MP3_RATES = frozenset({8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000})
"""The MPEG-1/2/2.5 layer III sample rates; other rates are resampled to 24 kHz."""


class Mp3Stream:
    """Constant bit rate MP3 at ``output_rate`` (a layer III rate)."""

    content_type = "audio/mpeg"

    def __init__(self, input_rate: int, output_rate: int, *, bitrate: int = MP3_BITRATE) -> None:
        if output_rate not in MP3_RATES:
            raise ValueError(f"mp3 cannot carry {output_rate} Hz; the rates are {sorted(MP3_RATES)}")
        self.sample_rate = output_rate
        self._encoder = PacketEncoder("libmp3lame", input_rate, output_rate, sample_format="fltp", bitrate=bitrate)

    def encode(self, chunk: np.ndarray) -> list[bytes]:
        return self._encoder.encode(chunk)

    def finish(self) -> list[bytes]:
        return self._encoder.finish()
