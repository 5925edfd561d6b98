"""AAC-LC in ADTS framing (FFmpeg's native AAC encoder through PyAV).

Raw AAC packets carry no configuration, so each one gets the 7-byte ADTS header (profile, rate
index, channels, length): the stream is then decodable from any packet, which is what an ``.aac``
file or an ``audio/aac`` HTTP body is.
"""

from __future__ import annotations

import numpy as np

from voxwire.audio.codec import PacketEncoder

AAC_BITRATE = 96_000
"""Mono AAC-LC at 96 kb/s is transparent for speech at 24-48 kHz."""

ADTS_RATE_INDEX = {
    96000: 0, 88200: 1, 64000: 2, 48000: 3, 44100: 4, 32000: 5,
    24000: 6, 22050: 7, 16000: 8, 12000: 9, 11025: 10, 8000: 11, 7350: 12,
}  # fmt: skip
"""ISO/IEC 14496-3 sampling frequency index."""

_AAC_LC_PROFILE = 1  # ADTS stores the audio object type minus one; AAC-LC is object type 2
_MONO = 1
_ADTS_HEADER_BYTES = 7
_MAX_FRAME_BYTES = (1 << 13) - 1  # frame_length is a 13-bit field
_VBR_FULLNESS = 0x7FF  # "buffer fullness unknown", the value for a variable bit rate stream


def adts_header(payload_bytes: int, sample_rate: int) -> bytes:
    """The ADTS header (no CRC) for one mono AAC-LC packet of ``payload_bytes``."""
    length = payload_bytes + _ADTS_HEADER_BYTES
    if length > _MAX_FRAME_BYTES:
        raise ValueError(f"an AAC packet of {payload_bytes} bytes does not fit an ADTS frame")
    index = ADTS_RATE_INDEX[sample_rate]
    return bytes(
        (
            0xFF,
            0xF1,  # sync word end, MPEG-4, layer 0, no CRC
            (_AAC_LC_PROFILE << 6) | (index << 2) | (_MONO >> 2),
            ((_MONO & 0b11) << 6) | (length >> 11),
            (length >> 3) & 0xFF,
            ((length & 0b111) << 5) | (_VBR_FULLNESS >> 6),
            ((_VBR_FULLNESS & 0b111111) << 2),  # and one raw data block per frame (stored as 0)
        )
    )


class AacStream:
    """ADTS AAC-LC at ``output_rate``, one ADTS frame per block."""

    content_type = "audio/aac"

    def __init__(self, input_rate: int, output_rate: int, *, bitrate: int = AAC_BITRATE) -> None:
        if output_rate not in ADTS_RATE_INDEX:
            raise ValueError(f"aac cannot carry {output_rate} Hz; the rates are {sorted(ADTS_RATE_INDEX)}")
        self.sample_rate = output_rate
        self._encoder = PacketEncoder("aac", input_rate, output_rate, sample_format="fltp", bitrate=bitrate)

    def encode(self, chunk: np.ndarray) -> list[bytes]:
        return self._framed(self._encoder.encode(chunk))

    def finish(self) -> list[bytes]:
        return self._framed(self._encoder.finish())

    def _framed(self, packets: list[bytes]) -> list[bytes]:
        return [adts_header(len(packet), self.sample_rate) + packet for packet in packets]
