"""Reading a voice clip: a file (WAV, FLAC, OGG, ...) or an array at any rate, to mono float32 at a target rate.

soundfile (libsndfile) and soxr are imported when a clip is decoded or resampled, not with this module: code
that only names ``AudioSource`` (the model, the engine, ``scripts/gpu_check.py``) runs where they are not
installed, and a clip read there fails with ``voxwire.audio.backend.AudioBackendMissingError``.

A file is decoded in bounded blocks, each mixed down to mono and fed through one streaming
resampler, so memory never holds more than a block of the source plus the mono result at the
target rate, whatever the source's channels, rate or compression. With ``max_seconds`` the duration
is checked from the file's header before anything is decoded, and decoding stops one block past
the limit whatever the header claims, so a small, highly compressed upload cannot expand into
gigabytes of samples. A rate above ``MAX_SOURCE_RATE`` or more than ``MAX_SOURCE_CHANNELS`` channels is
refused from the header too: decoding cost grows with both, and no microphone clip needs more.
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from voxwire.audio.backend import audio_backend
from voxwire.errors import InvalidInputError

if TYPE_CHECKING:
    import soundfile

AudioSource = str | Path | bytes | np.ndarray

_BLOCK_SAMPLES = 1 << 18
"""Source samples (all channels) decoded at a time: 1 MiB of float32."""
_QUALITY = "VHQ"
_UNKNOWN_FRAMES = 2**63 - 1
"""libsndfile's frame count for a file whose header does not give its length."""
_EMPTY = np.zeros(0, dtype=np.float32)

MAX_SOURCE_RATE = 192_000
"""Highest sample rate a clip may have (studio audio's highest; a 29 s FLAC at 655,350 Hz costs a second of CPU)."""
MAX_SOURCE_CHANNELS = 8
"""Most channels a clip may have (7.1 surround; each channel is decoded before the mix-down)."""


class ClipFormatError(InvalidInputError):
    """The clip's header states a sample rate or a channel count beyond what a voice clip may have."""


def check_source_format(rate: int, channels: int) -> None:
    """Refuse a clip whose rate or channel count would make decoding it costly (``ClipFormatError``)."""
    if rate > MAX_SOURCE_RATE:
        raise ClipFormatError(f"the clip's sample rate is {rate} Hz; the limit is {MAX_SOURCE_RATE} Hz")
    if channels > MAX_SOURCE_CHANNELS:
        raise ClipFormatError(f"the clip has {channels} channels; the limit is {MAX_SOURCE_CHANNELS}")


class ClipTooLongError(InvalidInputError):
    """The clip lasts longer than the caller's ``max_seconds``."""

    def __init__(self, duration_s: float | None, max_seconds: float) -> None:
        lasts = "more than" if duration_s is None else f"{duration_s:.1f} s, more than"
        super().__init__(f"the clip lasts {lasts} the limit of {max_seconds:g} s")
        self.duration_s = duration_s
        self.max_seconds = max_seconds


def load_clip(
    source: AudioSource, target_rate: int, source_rate: int | None = None, *, max_seconds: float | None = None
) -> np.ndarray:
    """Return ``source`` as mono float32 samples at ``target_rate``.

    Args:
        source: a path, the bytes of an audio file, or an array (N,) or (N, channels).
        target_rate: the rate the caller needs.
        source_rate: required for arrays; ignored for files, which carry their own rate.
        max_seconds: refuse a longer clip, before decoding it (None: no limit).

    Raises:
        ClipTooLongError: the clip is longer than ``max_seconds``.
        ClipFormatError: the rate is over ``MAX_SOURCE_RATE`` or the channels over ``MAX_SOURCE_CHANNELS``.
        InvalidInputError: unreadable, empty, or non-finite audio, or an array without its rate.
    """
    if isinstance(source, np.ndarray):
        if source_rate is None or source_rate <= 0:
            raise InvalidInputError("an audio array needs its sample rate")
        check_source_format(source_rate, source.shape[1] if source.ndim == 2 else 1)
        if max_seconds is not None and source.shape[0] > max_seconds * source_rate:
            raise ClipTooLongError(source.shape[0] / source_rate, max_seconds)
        samples = _mono(np.asarray(source, dtype=np.float32))
        if samples.size and source_rate != target_rate:
            soxr = audio_backend("soxr")
            samples = soxr.resample(samples, source_rate, target_rate, quality=_QUALITY).astype(np.float32)
    else:
        samples = _decode_file(source, target_rate, max_seconds)
    if samples.size == 0:
        raise InvalidInputError("the audio is empty")
    if not np.isfinite(samples).all():
        raise InvalidInputError("audio contains NaN or infinite samples (or values too large to process)")
    return samples


def _mono(samples: np.ndarray) -> np.ndarray:
    if samples.ndim == 2:
        samples = samples.mean(axis=1, dtype=np.float32)
    if samples.ndim != 1:
        raise InvalidInputError(f"audio must be mono or (samples, channels), got shape {samples.shape}")
    return samples


def _decode_file(source: str | Path | bytes, target_rate: int, max_seconds: float | None) -> np.ndarray:
    name = "the uploaded data" if isinstance(source, bytes) else str(source)
    soundfile = audio_backend("soundfile")
    try:
        handle = io.BytesIO(source) if isinstance(source, bytes) else str(source)
        with soundfile.SoundFile(handle) as sound:
            rate = sound.samplerate
            check_source_format(rate, sound.channels)
            # The header's length: refuse before decoding. It may be absent (a streamed FLAC: libsndfile then
            # reports the largest count) or wrong, so the read is bounded too.
            known = sound.frames < _UNKNOWN_FRAMES
            if max_seconds is not None and known and sound.frames > max_seconds * rate:
                raise ClipTooLongError(sound.frames / rate, max_seconds)
            limit = None if max_seconds is None else math.floor(max_seconds * rate)
            return _read_mono(sound, target_rate, limit, max_seconds)
    except (soundfile.LibsndfileError, RuntimeError, TypeError) as exc:
        raise InvalidInputError(f"cannot read {name} as audio: {exc}") from exc
    except FileNotFoundError as exc:
        raise InvalidInputError(f"audio file not found: {name}") from exc


def _read_mono(
    sound: soundfile.SoundFile, target_rate: int, limit: int | None, max_seconds: float | None
) -> np.ndarray:
    """Decode ``sound`` block by block into mono at ``target_rate``; at most ``limit`` source frames."""
    rate = sound.samplerate
    resampler = (
        None if rate == target_rate else audio_backend("soxr").ResampleStream(rate, target_rate, 1, "float32", _QUALITY)
    )
    block_frames = max(1, _BLOCK_SAMPLES // sound.channels)
    parts: list[np.ndarray] = []
    frames = 0
    while True:
        block = sound.read(block_frames, dtype="float32", always_2d=True)
        if block.shape[0] == 0:
            break
        frames += block.shape[0]
        if limit is not None and frames > limit:
            assert max_seconds is not None
            raise ClipTooLongError(None, max_seconds)
        mono = block.mean(axis=1, dtype=np.float32)
        parts.append(mono if resampler is None else resampler.resample_chunk(mono))
    if resampler is not None and frames:
        parts.append(resampler.resample_chunk(_EMPTY, last=True))
    return np.concatenate(parts) if parts else _EMPTY
