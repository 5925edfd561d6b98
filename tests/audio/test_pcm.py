"""PCM conversion, WAV framing and the shared encoder factory (the PyAV formats: test_codecs.py)."""

from __future__ import annotations

import struct
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import soundfile
import soxr

from voxwire.audio.formats import OPENAI_RESPONSE_FORMATS, AudioFormat, StreamEncoder, WavStream, make_encoder
from voxwire.audio.pcm import to_f32le, to_s16le, wav_header

EDGES = np.array([0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -3.0, 0.5 / 32767, 1.5 / 32767, -1e-9], dtype=np.float32)


def stream(encoder: StreamEncoder, chunks: list[np.ndarray]) -> bytes:
    blocks = [block for chunk in chunks for block in encoder.encode(chunk)] + encoder.finish()
    assert all(blocks), "encoders never return empty blocks"
    return b"".join(blocks)


def test_s16le_rounds_clips_and_is_little_endian() -> None:
    expected = [0, 32767, -32767, 16384, -16384, 32767, -32767, 0, 2, 0]  # rint: ties to even
    assert to_s16le(EDGES) == struct.pack("<10h", *expected)
    assert to_s16le(np.array([1.0], dtype=np.float32)) == b"\xff\x7f"


def test_f32le_is_the_samples_unchanged() -> None:
    assert to_f32le(EDGES) == struct.pack("<10f", *EDGES.tolist())
    assert to_f32le(np.array([1.0], dtype=np.float32)) == b"\x00\x00\x80\x3f"


def test_non_finite_samples_become_silence_or_full_scale() -> None:
    samples = np.array([np.nan, np.inf, -np.inf], dtype=np.float32)
    assert to_s16le(samples) == struct.pack("<3h", 0, 32767, -32767)
    assert to_f32le(samples) == struct.pack("<3f", 0.0, 1.0, -1.0)


def test_wav_header_fields() -> None:
    assert wav_header(24000, 10) == (
        b"RIFF" + struct.pack("<I", 56) + b"WAVEfmt " + struct.pack("<IHHIIHH", 16, 1, 1, 24000, 48000, 2, 16)
        + b"data" + struct.pack("<I", 20)
    )  # fmt: skip
    streamed = wav_header(24000)
    assert streamed[4:8] == streamed[40:44] == b"\xff\xff\xff\xff"
    with pytest.raises(ValueError, match="RIFF"):
        wav_header(24000, 2**31)


@pytest.fixture
def tone() -> np.ndarray:
    return (0.6 * np.sin(np.arange(24000 + 77) * 0.07)).astype(np.float32)


def chunks_of(samples: np.ndarray, size: int) -> list[np.ndarray]:
    return [samples[i : i + size] for i in range(0, samples.size, size)]


def ffmpeg_s16(path: Path, tool: Callable[[str], str]) -> np.ndarray:
    command = [tool("ffmpeg"), "-v", "error", "-i", str(path), "-f", "s16le", "-"]
    return np.frombuffer(subprocess.run(command, check=True, capture_output=True).stdout, dtype="<i2")


def test_streamed_wav_reads_back_in_both_length_modes(
    tone: np.ndarray, tool: Callable[[str], str], tmp_path: Path
) -> None:
    encoder = make_encoder("wav", 24000)
    assert isinstance(encoder, WavStream)
    data = stream(encoder, chunks_of(tone, 1920))
    assert data[:44] == wav_header(24000)
    expected = np.frombuffer(to_s16le(tone), dtype="<i2")

    unknown = tmp_path / "unknown.wav"
    unknown.write_bytes(data)
    known = tmp_path / "known.wav"
    known.write_bytes(encoder.final_header() + data[44:])
    for path in (unknown, known):
        read, rate = soundfile.read(path, dtype="int16")
        assert rate == 24000
        np.testing.assert_array_equal(read, expected)
        np.testing.assert_array_equal(ffmpeg_s16(path, tool), expected)
    assert soundfile.info(str(known)).frames == tone.size


def test_pcm_formats_at_the_model_rate(tone: np.ndarray) -> None:
    assert stream(make_encoder("pcm_s16le", 48000), chunks_of(tone, 7680)) == to_s16le(tone)
    assert stream(make_encoder(AudioFormat.PCM_F32LE, 48000), chunks_of(tone, 7680)) == to_f32le(tone)


def test_openai_pcm_is_24k_s16le_from_any_model_rate(speech: Callable[[int], np.ndarray]) -> None:
    fmt, rate = OPENAI_RESPONSE_FORMATS["pcm"]
    assert (fmt, rate) == (AudioFormat.PCM_S16LE, 24000)
    samples = speech(44100)
    encoder = make_encoder(fmt, 44100, output_rate=rate)
    assert encoder.sample_rate == 24000
    out = np.frombuffer(stream(encoder, chunks_of(samples, 7056)), dtype="<i2")
    reference = np.frombuffer(to_s16le(soxr.resample(samples, 44100, 24000)), dtype="<i2")
    np.testing.assert_array_equal(out, reference)


@pytest.mark.parametrize(
    ("fmt", "content_type"),
    [
        ("opus", "audio/opus"),
        ("ogg_opus", "audio/ogg; codecs=opus"),
        ("pcm_s16le", "audio/pcm;rate=44100;encoding=s16le"),
        ("pcm_f32le", "audio/pcm;rate=44100;encoding=f32le"),
        ("wav", "audio/wav"),
        ("flac", "audio/flac"),
        ("mp3", "audio/mpeg"),
        ("aac", "audio/aac"),
    ],
)
def test_every_format_streams_through_one_interface(fmt: str, content_type: str, tone: np.ndarray) -> None:
    encoder = make_encoder(fmt, 44100)
    assert encoder.content_type == content_type
    assert encoder.sample_rate == (48000 if "opus" in fmt else 44100)
    assert len(stream(encoder, chunks_of(tone, 7056))) > 0
    with pytest.raises(RuntimeError):
        encoder.finish()


def test_unknown_format_is_rejected() -> None:
    with pytest.raises(ValueError):
        make_encoder("vorbis", 24000)
