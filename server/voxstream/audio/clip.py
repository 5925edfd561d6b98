"""Reading a voice clip: a file (WAV, FLAC, OGG, ...) or an array at any rate, to mono float32 at a target rate."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import soundfile
import soxr

from voxstream.errors import InvalidInputError

AudioSource = str | Path | bytes | np.ndarray


def load_clip(source: AudioSource, target_rate: int, source_rate: int | None = None) -> np.ndarray:
    """Return ``source`` as mono float32 samples at ``target_rate``.

    Args:
        source: a path, the bytes of an audio file, or an array (N,) or (N, channels).
        target_rate: the rate the caller needs.
        source_rate: required for arrays; ignored for files, which carry their own rate.

    Raises:
        InvalidInputError: unreadable, empty, or non-finite audio, or an array without its rate.
    """
    if isinstance(source, np.ndarray):
        if source_rate is None or source_rate <= 0:
            raise InvalidInputError("an audio array needs its sample rate")
        samples, rate = source, source_rate
    else:
        samples, rate = _read_file(source)
    samples = np.asarray(samples, dtype=np.float32)
    if samples.ndim == 2:
        samples = samples.mean(axis=1, dtype=np.float32)
    if samples.ndim != 1 or samples.size == 0:
        raise InvalidInputError(f"audio must be mono or (samples, channels) and non-empty, got shape {samples.shape}")
    if not np.isfinite(samples).all():
        raise InvalidInputError("audio contains NaN or infinite samples")
    if rate != target_rate:
        samples = soxr.resample(samples, rate, target_rate, quality="VHQ").astype(np.float32)
    return samples


def _read_file(source: str | Path | bytes) -> tuple[np.ndarray, int]:
    try:
        handle = io.BytesIO(source) if isinstance(source, bytes) else str(source)
        samples, rate = soundfile.read(handle, dtype="float32", always_2d=True)
    except (soundfile.LibsndfileError, RuntimeError, TypeError) as exc:
        name = "the uploaded data" if isinstance(source, bytes) else str(source)
        raise InvalidInputError(f"cannot read {name} as audio: {exc}") from exc
    except FileNotFoundError as exc:
        raise InvalidInputError(f"audio file not found: {source}") from exc
    return samples, rate
