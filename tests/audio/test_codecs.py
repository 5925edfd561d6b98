"""mp3, aac and flac through PyAV: streamed as encoded, read by ffprobe/ffmpeg with the right duration."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from voxwire.audio.aac import adts_header
from voxwire.audio.formats import make_encoder
from voxwire.audio.pcm import to_s16le


def chunks_of(samples: np.ndarray, size: int) -> list[np.ndarray]:
    return [samples[i : i + size] for i in range(0, samples.size, size)]


def encode(fmt: str, rate: int, chunks: list[np.ndarray]) -> tuple[list[bytes], list[bytes]]:
    """(blocks returned while encoding, blocks returned by finish)."""
    encoder = make_encoder(fmt, rate)
    streamed = [block for chunk in chunks for block in encoder.encode(chunk)]
    final = encoder.finish()
    assert all(streamed + final), "encoders never return empty blocks"
    return streamed, final


def probe(path: Path, tool: Callable[[str], str]) -> dict:
    command = [tool("ffprobe"), "-v", "error", "-count_packets", "-show_streams", "-show_format"]
    result = subprocess.run([*command, "-of", "json", str(path)], check=True, capture_output=True, text=True)
    return json.loads(result.stdout)


def ffmpeg_f32(path: Path, tool: Callable[[str], str]) -> np.ndarray:
    command = [tool("ffmpeg"), "-v", "error", "-i", str(path), "-f", "f32le", "-ac", "1", "-"]
    return np.frombuffer(subprocess.run(command, check=True, capture_output=True).stdout, dtype="<f4")


def best_alignment_correlation(decoded: np.ndarray, source: np.ndarray, max_lag: int) -> float:
    """The highest normalised correlation of ``decoded`` against ``source`` over codec delays up to ``max_lag``."""
    best = 0.0
    for lag in range(max_lag):
        a = decoded[lag : lag + source.size]
        b = source[: a.size]
        best = max(best, float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-12)))
    return best


def probed_duration(info: dict) -> float:
    """The duration ffprobe reads: from the size for CBR mp3; from the packets for ADTS, whose size says little."""
    (stream,) = info["streams"]
    if stream["codec_name"] == "aac":
        return int(stream["nb_read_packets"]) * 1024 / int(stream["sample_rate"])
    return float(info["format"]["duration"])


@pytest.mark.parametrize(("fmt", "codec"), [("mp3", "mp3"), ("aac", "aac")])
def test_lossy_formats_stream_and_decode_to_the_speech(
    fmt: str,
    codec: str,
    model_rate: int,
    model_chunk: int,
    speech: Callable[[int], np.ndarray],
    tool: Callable[[str], str],
    tmp_path: Path,
) -> None:
    samples = speech(model_rate)
    streamed, final = encode(fmt, model_rate, chunks_of(samples, model_chunk))
    assert len(streamed) > 10, "packets leave while the audio is being encoded, not at the end"
    path = tmp_path / f"speech.{fmt}"
    path.write_bytes(b"".join(streamed + final))
    info = probe(path, tool)
    (stream,) = info["streams"]
    assert (stream["codec_name"], int(stream["sample_rate"]), stream["channels"]) == (codec, model_rate, 1)
    duration = samples.size / model_rate
    # Both add the codec's delay and pad the last frame: a few frames at most.
    assert 0 <= probed_duration(info) - duration < 0.15, (probed_duration(info), duration)
    decoded = ffmpeg_f32(path, tool)
    # The decoder adds the codec's delay and the last frame's padding: at most a few frames.
    assert 0 <= decoded.size - samples.size < 4 * 1152 + 2112
    window = samples[model_rate : 2 * model_rate]  # one second of speech, past the start
    assert best_alignment_correlation(decoded[model_rate:], window, 3000) > 0.95


def encode_whole(fmt: str, chunks: list[np.ndarray]) -> bytes:
    streamed, final = encode(fmt, 24000, chunks)
    return b"".join(streamed + final)


@pytest.mark.parametrize("fmt", ["mp3", "aac", "flac"])
def test_chunking_is_invisible(fmt: str, speech: Callable[[int], np.ndarray]) -> None:
    samples = speech(24000)[:48000]
    assert encode_whole(fmt, [samples]) == encode_whole(fmt, chunks_of(samples, 999))


def test_aac_blocks_are_whole_adts_frames(speech: Callable[[int], np.ndarray]) -> None:
    streamed, final = encode("aac", 48000, chunks_of(speech(48000), 7680))
    for block in streamed + final:
        assert block[:2] == b"\xff\xf1"
        length = ((block[3] & 0b11) << 11) | (block[4] << 3) | (block[5] >> 5)
        assert length == len(block)
        assert (block[2] >> 2) & 0b1111 == 3  # 48 kHz


def test_adts_header_fields() -> None:
    assert adts_header(100, 44100) == bytes([0xFF, 0xF1, 0x50, 0x40, 0x0D, 0x7F, 0xFC])
    with pytest.raises(ValueError):
        adts_header(9000, 44100)


def test_flac_streams_frames_and_is_lossless_to_16_bits(
    model_rate: int, model_chunk: int, speech: Callable[[int], np.ndarray], tool: Callable[[str], str], tmp_path: Path
) -> None:
    samples = speech(model_rate)
    streamed, final = encode("flac", model_rate, chunks_of(samples, model_chunk))
    assert streamed[0].startswith(b"fLaC"), "the header leaves with the first frame"
    assert sum(map(len, streamed)) > 0.8 * sum(map(len, streamed + final)), "most of the file leaves before the end"
    path = tmp_path / "speech.flac"
    path.write_bytes(b"".join(streamed + final))
    assert int(probe(path, tool)["streams"][0]["sample_rate"]) == model_rate
    # STREAMINFO says "length unknown", which libsndfile cannot read to the end; ffmpeg (and libFLAC) can.
    expected = np.frombuffer(to_s16le(samples), dtype="<i2")
    np.testing.assert_array_equal(ffmpeg_s16(path, tool), expected)


def ffmpeg_s16(path: Path, tool: Callable[[str], str]) -> np.ndarray:
    command = [tool("ffmpeg"), "-v", "error", "-i", str(path), "-f", "s16le", "-"]
    return np.frombuffer(subprocess.run(command, check=True, capture_output=True).stdout, dtype="<i2")


def test_empty_flac_is_still_a_file(tool: Callable[[str], str], tmp_path: Path) -> None:
    streamed, final = encode("flac", 24000, [])
    assert streamed == [] and final[0].startswith(b"fLaC")
    path = tmp_path / "empty.flac"
    path.write_bytes(b"".join(final))
    assert ffmpeg_s16(path, tool).size == 0


def test_rates_a_codec_cannot_carry_are_refused() -> None:
    with pytest.raises(ValueError, match="mp3 cannot carry"):
        make_encoder("mp3", 44100, output_rate=96000)
    with pytest.raises(ValueError, match="aac cannot carry"):
        make_encoder("aac", 44100, output_rate=50000)
