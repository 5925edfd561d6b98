"""G.711 for phone gateways: every 16-bit sample companded as the reference coder (Python's ``audioop``) does, and
a streamed utterance that FFmpeg's G.711 decoder plays back as the speech it was, at 8 kHz."""

from __future__ import annotations

import importlib
import subprocess
from collections.abc import Callable

import numpy as np
import pytest

from voxwire.audio.formats import TELEPHONY_RATE, make_encoder
from voxwire.audio.g711 import s16_to_alaw, s16_to_mulaw

FFMPEG_FORMATS = {"pcm_mulaw": "mulaw", "pcm_alaw": "alaw"}
"""Our format -> FFmpeg's raw G.711 muxer."""


def ffmpeg(tool: Callable[[str], str], data: bytes, *args: str) -> bytes:
    command = [tool("ffmpeg"), "-v", "error", *args]
    return subprocess.run(command, input=data, check=True, capture_output=True).stdout


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize(("coder", "compand"), [("lin2ulaw", s16_to_mulaw), ("lin2alaw", s16_to_alaw)])
def test_every_sample_value_is_coded_as_the_reference_coder_codes_it(
    coder: str, compand: Callable[[np.ndarray], np.ndarray]
) -> None:
    audioop = importlib.import_module("audioop")  # the standard library's before 3.13, audioop-lts's after
    every_value = np.arange(-32768, 32768, dtype=np.int16)
    ours = compand(every_value)
    assert ours.dtype == np.uint8 and ours.size == every_value.size
    assert ours.tobytes() == getattr(audioop, coder)(every_value.tobytes(), 2)


@pytest.mark.parametrize("fmt", ["pcm_mulaw", "pcm_alaw"])
def test_a_streamed_utterance_decodes_to_the_speech_at_8khz(
    fmt: str, speech: Callable[[int], np.ndarray], tool: Callable[[str], str]
) -> None:
    source = speech(48000)
    whole = make_encoder(fmt, 48000)
    streaming = make_encoder(fmt, 48000)
    assert whole.sample_rate == TELEPHONY_RATE and f"encoding={FFMPEG_FORMATS[fmt]}" in whole.content_type
    streamed = b"".join(block for i in range(0, source.size, 7680) for block in streaming.encode(source[i : i + 7680]))
    streamed += b"".join(streaming.finish())
    assert streamed == b"".join(whole.encode(source) + whole.finish())  # chunking changes no byte
    assert abs(len(streamed) - source.size / 6) <= 1  # one byte per 8 kHz sample

    rate = ["-ar", str(TELEPHONY_RATE), "-ac", "1"]
    decoded = np.frombuffer(
        ffmpeg(tool, streamed, "-f", FFMPEG_FORMATS[fmt], *rate, "-i", "-", "-f", "f32le", "-"), dtype="<f4"
    )
    expected = speech(TELEPHONY_RATE)[: decoded.size]
    correlation = float(decoded @ expected / (np.linalg.norm(decoded) * np.linalg.norm(expected)))
    assert correlation > 0.99, correlation


def test_an_asked_rate_overrides_the_telephone_rate() -> None:
    encoder = make_encoder("pcm_mulaw", 48000, output_rate=16000)
    assert encoder.sample_rate == 16000
    assert len(b"".join(encoder.encode(np.zeros(4800, np.float32)) + encoder.finish())) == 1600
