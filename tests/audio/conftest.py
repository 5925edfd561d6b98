"""Shared audio test material: a real speech clip (espeak-ng) and the external decoders.

Missing binaries fail the test with the package to install: CI installs them, so a skip
would hide a broken setup.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable

import numpy as np
import pytest
import soundfile
import soxr

PACKAGES = {
    "espeak-ng": "espeak-ng",
    "ffmpeg": "ffmpeg",
    "ffprobe": "ffmpeg",
    "opusdec": "opus-tools",
    "opusinfo": "opus-tools",
}
SPEECH_TEXT = (
    "The quick brown fox jumps over the lazy dog. "
    "Streaming speech must sound the same whether it arrives in one piece or in many."
)
MODEL_CHUNKS = {16000: 1280, 44100: 7056, 48000: 7680}
"""Model output rate -> samples per chunk (80 ms at 16 kHz, 160 ms otherwise)."""


def require(binary: str) -> str:
    path = shutil.which(binary)
    if path is None:
        pytest.fail(f"`{binary}` not found: install the Debian package `{PACKAGES[binary]}`", pytrace=False)
    return path


@pytest.fixture(scope="session")
def tool() -> Callable[[str], str]:
    """``tool("opusdec")`` -> path of the binary, failing the test when it is missing."""
    return require


@pytest.fixture(scope="session")
def speech_source(tmp_path_factory: pytest.TempPathFactory) -> tuple[np.ndarray, int]:
    """About 7 s of espeak-ng speech (22.05 kHz), scaled to peak at 0.9."""
    wav = tmp_path_factory.mktemp("speech") / "speech.wav"
    subprocess.run([require("espeak-ng"), "-w", str(wav), SPEECH_TEXT], check=True, capture_output=True)
    samples, rate = soundfile.read(wav, dtype="float32")
    return samples * np.float32(0.9 / np.abs(samples).max()), rate


@pytest.fixture(scope="session")
def speech(speech_source: tuple[np.ndarray, int]) -> Callable[[int], np.ndarray]:
    """``speech(rate)`` -> the clip as float32 mono at ``rate`` (a model output rate)."""
    samples, rate = speech_source

    def at(target: int) -> np.ndarray:
        return soxr.resample(samples, rate, target).astype(np.float32)

    return at


@pytest.fixture(params=sorted(MODEL_CHUNKS), ids=lambda rate: f"{rate}Hz")
def model_rate(request: pytest.FixtureRequest) -> int:
    """Each model output rate in turn."""
    return request.param


@pytest.fixture
def model_chunk(model_rate: int) -> int:
    """Samples per model chunk at ``model_rate``."""
    return MODEL_CHUNKS[model_rate]


def chunked(samples: np.ndarray, size: int) -> list[np.ndarray]:
    return [samples[i : i + size] for i in range(0, samples.size, size)]


@pytest.fixture(scope="session")
def split() -> Callable[[np.ndarray, int], list[np.ndarray]]:
    """``split(samples, size)`` -> consecutive chunks of ``size`` samples (the last may be shorter)."""
    return chunked
