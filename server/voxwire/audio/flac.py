"""FLAC streamed as it is encoded (FFmpeg's FLAC encoder through PyAV).

A FLAC stream is ``fLaC``, the STREAMINFO block, then frames. STREAMINFO's total sample count
and MD5 may be zero, meaning "unknown" (the FLAC format allows it for streams), so the header
goes out at once with the values FFmpeg sets at open, and every frame follows as soon as it is
encoded; decoders then read to the end of the stream (FFmpeg, browsers, the ``flac`` tool). libsndfile
takes the zero count for a length it cannot seek in, and Python's ``soundfile`` raises on reading it,
so a whole file gets ``final_header()``: the STREAMINFO FFmpeg sends back when it is flushed, with
the real count, frame sizes and MD5, in the same 42 bytes.
"""

from __future__ import annotations

import struct

import numpy as np

from voxwire.audio.codec import PacketEncoder

_FLAC_MARKER = b"fLaC"
_STREAMINFO = 0
_LAST_BLOCK = 0x80
_STREAMINFO_BYTES = 34
FLAC_HEADER_BYTES = len(_FLAC_MARKER) + 4 + _STREAMINFO_BYTES
"""``fLaC``, the STREAMINFO block's header and the block: what ``final_header`` replaces."""


def _stream_header(streaminfo: bytes) -> bytes:
    if len(streaminfo) != _STREAMINFO_BYTES:
        raise RuntimeError(f"FFmpeg's FLAC encoder gave {len(streaminfo)} bytes of STREAMINFO, not 34")
    block_header = struct.pack(">B", _LAST_BLOCK | _STREAMINFO) + _STREAMINFO_BYTES.to_bytes(3, "big")
    return _FLAC_MARKER + block_header + streaminfo


class FlacStream:
    """16-bit FLAC at ``output_rate``: the header with the first block, then one FLAC frame per block."""

    content_type = "audio/flac"

    def __init__(self, input_rate: int, output_rate: int) -> None:
        self.sample_rate = output_rate
        self._encoder = PacketEncoder("flac", input_rate, output_rate, sample_format="s16")
        self._header: bytes | None = _stream_header(self._encoder.extradata)

    def encode(self, chunk: np.ndarray) -> list[bytes]:
        return self._with_header(self._encoder.encode(chunk))

    def finish(self) -> list[bytes]:
        return self._with_header(self._encoder.finish(), last=True)  # an empty stream is still a FLAC file

    def final_header(self) -> bytes:
        """The header with the real sample count, frame sizes and MD5 (once ``finish`` has run), to overwrite
        the first ``FLAC_HEADER_BYTES`` of the whole stream."""
        return _stream_header(self._encoder.final_extradata)

    def _with_header(self, frames: list[bytes], *, last: bool = False) -> list[bytes]:
        if self._header is None or not (frames or last):
            return frames
        header, self._header = self._header, None
        return [header, *frames]
