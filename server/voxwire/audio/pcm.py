"""Sample conversion and WAV framing for model output.

Model chunks are float32 mono in [-1, 1]. This module validates them, turns them into
little-endian PCM bytes (s16 or f32) and writes the 44-byte RIFF/WAVE header, either with
the real sizes or with 0xFFFFFFFF sizes for a stream whose length is not known yet.
"""

from __future__ import annotations

import struct

import numpy as np

S16_SCALE = 32767.0
"""float -> s16 maps [-1, 1] onto [-32767, 32767] so both polarities clip symmetrically."""

UNKNOWN_SIZE = 0xFFFFFFFF
"""RIFF and data chunk size for a streamed WAV; ffmpeg and libsndfile then read to EOF."""

WAV_HEADER_BYTES = 44
_WAVE_FORMAT_PCM = 1
_S16_BYTES = 2


def as_mono_float32(chunk: np.ndarray) -> np.ndarray:
    """Return ``chunk`` as a contiguous 1-D float32 array; non-finite samples become silence/full scale.

    A NaN from the model must not reach an encoder, where it would turn into undefined
    integer values or a broken Opus frame.
    """
    samples = np.ascontiguousarray(chunk, dtype=np.float32)
    if samples.ndim != 1:
        raise ValueError(f"expected a 1-D mono chunk, got shape {samples.shape}")
    if not np.isfinite(samples).all():
        samples = np.nan_to_num(samples, nan=0.0, posinf=1.0, neginf=-1.0)
    return samples


def to_s16le(samples: np.ndarray) -> bytes:
    """Clip to [-1, 1], scale by 32767 and round to nearest (ties to even) as little-endian int16."""
    clipped = np.clip(as_mono_float32(samples), -1.0, 1.0)
    return np.rint(clipped * S16_SCALE).astype("<i2").tobytes()


def to_f32le(samples: np.ndarray) -> bytes:
    """Little-endian float32, values unchanged (a float consumer can hold overs; nothing is clipped)."""
    return as_mono_float32(samples).astype("<f4", copy=False).tobytes()


def wav_header(sample_rate: int, num_frames: int | None = None) -> bytes:
    """Canonical 44-byte header for mono s16le PCM.

    ``num_frames=None`` writes 0xFFFFFFFF for both sizes, the convention for a stream of
    unknown length; a writer that can seek rewrites the header with the real count at the end.
    """
    if num_frames is None:
        data_size = riff_size = UNKNOWN_SIZE
    else:
        data_size = num_frames * _S16_BYTES
        riff_size = WAV_HEADER_BYTES - 8 + data_size
        if riff_size > UNKNOWN_SIZE - 1:
            raise ValueError(f"{num_frames} frames do not fit in a RIFF file")
    return struct.pack(
        "<4sI4s4sIHHIIHH4sI",
        b"RIFF",
        riff_size,
        b"WAVE",
        b"fmt ",
        16,
        _WAVE_FORMAT_PCM,
        1,
        sample_rate,
        sample_rate * _S16_BYTES,
        _S16_BYTES,
        16,
        b"data",
        data_size,
    )
