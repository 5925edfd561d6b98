"""A clip whose header states an absurd rate or channel count is refused before any sample is decoded: such a
file is small on the wire (a 165 KB FLAC of 29 s at 655,350 Hz, 8 channels) but costs a second of CPU to decode."""

from __future__ import annotations

import io

import numpy as np
import pytest
import soundfile

from voxwire.audio import clip
from voxwire.audio.clip import MAX_SOURCE_CHANNELS, MAX_SOURCE_RATE, ClipFormatError, load_clip
from voxwire.errors import InvalidInputError


def _flac(rate: int, channels: int, seconds: float = 0.05) -> bytes:
    frames = int(rate * seconds)
    data = io.BytesIO()
    soundfile.write(data, np.zeros((frames, channels), dtype=np.float32), rate, format="FLAC")
    return data.getvalue()


def _wav(rate: int, channels: int, seconds: float = 0.05) -> bytes:
    data = io.BytesIO()
    soundfile.write(data, np.zeros((int(rate * seconds), channels), dtype=np.float32), rate, format="WAV")
    return data.getvalue()


@pytest.fixture
def no_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a refused clip was decoded")

    monkeypatch.setattr(clip, "_read_mono", refuse)


@pytest.mark.usefixtures("no_decoding")
@pytest.mark.parametrize(
    ("source", "limit"),
    [
        (_flac(655_350, 2), f"{MAX_SOURCE_RATE} Hz"),
        (_wav(48_000, MAX_SOURCE_CHANNELS + 1), f"limit is {MAX_SOURCE_CHANNELS}"),
        (_wav(384_000, 1), f"{MAX_SOURCE_RATE} Hz"),
    ],
    ids=["flac-655350Hz", "wav-9-channels", "wav-384kHz"],
)
def test_an_absurd_rate_or_channel_count_is_refused_from_the_header(source: bytes, limit: str) -> None:
    with pytest.raises(ClipFormatError, match=limit) as refused:
        load_clip(source, 16_000, max_seconds=30)
    assert isinstance(refused.value, InvalidInputError)  # the API's typed 400, never a server error


def test_arrays_are_held_to_the_same_bounds() -> None:
    with pytest.raises(ClipFormatError):
        load_clip(np.zeros(100, dtype=np.float32), 16_000, MAX_SOURCE_RATE + 1)
    with pytest.raises(ClipFormatError):
        load_clip(np.zeros((100, MAX_SOURCE_CHANNELS + 1), dtype=np.float32), 16_000, 16_000)


def test_the_largest_allowed_formats_still_load() -> None:
    samples = load_clip(_flac(MAX_SOURCE_RATE, MAX_SOURCE_CHANNELS, seconds=0.1), 16_000)
    assert samples.dtype == np.float32 and abs(samples.size - 1600) <= 2
