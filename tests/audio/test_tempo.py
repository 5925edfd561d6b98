"""The tempo stage (``audio/tempo.py``): speech sped up or slowed down, streamed, at the same pitch."""

from __future__ import annotations

import numpy as np
import pytest

from voxwire.audio.formats import TempoEncoder, make_encoder
from voxwire.audio.tempo import StreamTempo, atempo_factors

RATE = 16000
CHUNK = 1280  # one 80 ms patch of a 16 kHz model


def tone(seconds: float, frequency: float = 220.0) -> np.ndarray:
    t = np.arange(round(seconds * RATE)) / RATE
    return (0.5 * np.sin(2 * np.pi * frequency * t)).astype(np.float32)


def stretched(audio: np.ndarray, speed: float, chunk: int) -> np.ndarray:
    tempo = StreamTempo(RATE, speed)
    blocks = [tempo.process(audio[i : i + chunk]) for i in range(0, audio.size, chunk)]
    return np.concatenate([*blocks, tempo.flush()])


def dominant_frequency(audio: np.ndarray) -> float:
    spectrum = np.abs(np.fft.rfft(audio * np.hanning(audio.size)))
    return float(np.argmax(spectrum)) * RATE / audio.size


@pytest.mark.parametrize("speed", [0.25, 0.5, 0.8, 1.25, 2.0, 3.0, 4.0])
def test_the_duration_scales_by_one_over_speed(speed: float) -> None:
    audio = tone(1.37)
    out = stretched(audio, speed, CHUNK)
    assert abs(out.size / RATE - audio.size / RATE / speed) < 0.002


@pytest.mark.parametrize("speed", [0.25, 0.7, 1.5, 4.0])
def test_the_pitch_is_kept(speed: float) -> None:
    out = stretched(tone(2.0, 330.0), speed, CHUNK)
    assert abs(dominant_frequency(out) - 330.0) < 2.0
    assert np.abs(out).max() > 0.3, "the tone is still there, not faded out"


@pytest.mark.parametrize("speed", [0.25, 0.6, 1.7, 4.0])
def test_chunked_output_equals_the_whole_signal_at_once(speed: float) -> None:
    rng = np.random.default_rng(5)
    audio = (tone(1.1) + 0.1 * rng.standard_normal(round(1.1 * RATE))).astype(np.float32)
    whole = stretched(audio, speed, audio.size)
    for chunk in (CHUNK, 777, 160, 3):
        np.testing.assert_array_equal(stretched(audio, speed, chunk), whole)


def test_audio_streams_before_the_end() -> None:
    tempo = StreamTempo(RATE, 1.5)
    early = sum(tempo.process(chunk).size for chunk in np.split(tone(1.0), 10))
    assert early > 0.5 * RATE / 1.5, "most of the audio comes out while input still arrives"


def test_factors_stay_in_atempos_range_and_multiply_to_the_speed() -> None:
    for speed in (0.25, 0.3, 0.5, 1.0, 2.0, 2.5, 4.0):
        factors = atempo_factors(speed)
        assert all(0.5 <= factor <= 2.0 for factor in factors)
        assert np.prod(factors) == pytest.approx(speed)
    assert len(atempo_factors(0.25)) == len(atempo_factors(4.0)) == 2
    for bad in (0.2, 4.5, 0.0):
        with pytest.raises(ValueError, match="speed"):
            atempo_factors(bad)


@pytest.mark.parametrize("fmt", ["pcm_s16le", "opus", "mp3"])
def test_speed_one_is_the_encoder_itself(fmt: str) -> None:
    audio = tone(0.5)
    plain, same = make_encoder(fmt, RATE), make_encoder(fmt, RATE, speed=1.0)
    assert type(same) is type(plain) and not isinstance(same, TempoEncoder)
    assert plain.encode(audio) + plain.finish() == same.encode(audio) + same.finish()


def test_an_encoder_at_speed_two_gives_half_the_samples_at_its_rate() -> None:
    encoder = make_encoder("pcm_s16le", RATE, output_rate=24000, speed=2.0)
    assert encoder.sample_rate == 24000 and encoder.content_type == "audio/pcm;rate=24000;encoding=s16le"
    audio = tone(1.0)
    body = b"".join([*encoder.encode(audio[:CHUNK]), *encoder.encode(audio[CHUNK:]), *encoder.finish()])
    assert abs(len(body) // 2 - 12000) <= 2
