"""G.711 companding (mu-law and A-law), the telephone network's 8-bit sample formats.

Phone gateways (Twilio, Telnyx, SIP trunks) carry 8 kHz mu-law or A-law: one byte per sample. The encoders follow
the ITU-T G.711 decision levels as Sun's reference ``g711.c`` codes them (as Python's ``audioop`` does; FFmpeg's
encoder rounds to the nearest level instead, so the two differ by one step at some values), and any G.711 decoder
plays them. They work on whole arrays with numpy: a 160 ms chunk is one call, not a loop per sample.
"""

from __future__ import annotations

import numpy as np

from voxwire.audio.pcm import S16_SCALE, as_mono_float32

_MULAW_CLIP = 8159
"""Largest 14-bit magnitude mu-law distinguishes (the 16-bit sample shifted right by 2); larger ones clip."""
_MULAW_BIAS = 0x21
"""Added before the segment search so that every segment's step doubles the previous one's."""
_MULAW_SEGMENT_ENDS = np.array([0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF], dtype=np.int32)
_ALAW_SEGMENT_ENDS = np.array([0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF], dtype=np.int32)
_ALAW_EVEN_BITS = 0x55
"""A-law inverts every other bit of the code (and the sign bit for positive samples: 0xD5)."""


def _s16(samples: np.ndarray) -> np.ndarray:
    """float32 in [-1, 1] -> int32 holding s16 values, rounded as ``pcm.to_s16le`` rounds."""
    clipped = np.clip(as_mono_float32(samples), -1.0, 1.0)
    return np.rint(clipped * S16_SCALE).astype(np.int32)


def s16_to_mulaw(pcm: np.ndarray) -> np.ndarray:
    """int16-valued array -> uint8 mu-law codes."""
    value = pcm.astype(np.int32) >> 2
    negative = value < 0
    magnitude = np.minimum(np.where(negative, -value, value), _MULAW_CLIP) + _MULAW_BIAS
    segment = np.searchsorted(_MULAW_SEGMENT_ENDS, magnitude)  # the first end >= magnitude; 8 past the last
    code = np.where(segment >= 8, 0x7F, (segment << 4) | ((magnitude >> (segment + 1)) & 0x0F))
    return (code ^ np.where(negative, 0x7F, 0xFF)).astype(np.uint8)


def s16_to_alaw(pcm: np.ndarray) -> np.ndarray:
    """int16-valued array -> uint8 A-law codes."""
    value = pcm.astype(np.int32) >> 3
    negative = value < 0
    magnitude = np.where(negative, -value - 1, value)
    segment = np.searchsorted(_ALAW_SEGMENT_ENDS, magnitude)
    shift = np.where(segment < 2, 1, segment)
    code = np.where(segment >= 8, 0x7F, (segment << 4) | ((magnitude >> shift) & 0x0F))
    mask = np.where(negative, _ALAW_EVEN_BITS, _ALAW_EVEN_BITS | 0x80)
    return (code ^ mask).astype(np.uint8)


def to_mulaw(samples: np.ndarray) -> bytes:
    """float32 mono samples in [-1, 1] -> G.711 mu-law bytes."""
    return s16_to_mulaw(_s16(samples)).tobytes()


def to_alaw(samples: np.ndarray) -> bytes:
    """float32 mono samples in [-1, 1] -> G.711 A-law bytes."""
    return s16_to_alaw(_s16(samples)).tobytes()
