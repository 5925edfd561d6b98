"""Opus encoder: chunking is invisible, and independent decoders give back the input.

Material: espeak-ng speech (~7 s) resampled to each model rate and fed in model-sized chunks.
Decoders: ffmpeg's native Opus decoder (no libopus code) and opusdec (libopus), both to 48 kHz,
compared with the input resampled to 48 kHz after their own pre-skip and end trimming.

Thresholds (measured on libopus 1.3.1 / ffmpeg 5.1, x86-64):

- 64 kb/s (CELT mode): output aligned to the sample (best lag 0 for both decoders), SNR >= 16 dB
  (measured 19.8 dB at 44.1/48 kHz, 25.6-26.1 dB at 16 kHz), max abs error <= 0.25 (0.06-0.11).
- 32 kb/s, the default (SILK/hybrid modes): SNR >= 13 dB with ffmpeg (measured 16.7-21.4 dB);
  opusdec >= 11 dB at its best lag (13.5-15.2 dB). libopus' decoder puts SILK output 1-3 samples
  (48 kHz) early while ffmpeg's is exact, so this case allows |lag| <= 3.

A wrong pre-skip shows as a lag of hundreds of samples, so both cases pin the alignment.
"""

from __future__ import annotations

import itertools
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import opuslib
import pytest
import soundfile
import soxr

from voxwire.audio.formats import make_encoder
from voxwire.audio.opus import DEFAULT_COMPLEXITY, OpusEncoder
from voxwire.audio.quality import spectral_snr_db

MAX_LAG = 8


def encode_in_chunks(encoder: OpusEncoder, samples: np.ndarray, sizes: list[int]) -> list[bytes]:
    """Feed ``samples`` in chunks cycling through ``sizes``, then finish."""
    out: list[bytes] = []
    position = 0
    for size in itertools.cycle(sizes):
        if position >= samples.size:
            break
        out += encoder.encode(samples[position : position + size])
        position += size
    return out + encoder.finish()


def test_chunking_is_invisible(model_rate: int, model_chunk: int, speech: Callable[[int], np.ndarray]) -> None:
    """Model chunks, irregular chunks and one call give the same packets: no seams at chunk boundaries."""
    samples = speech(model_rate)
    whole = encode_in_chunks(OpusEncoder(model_rate), samples, [samples.size])
    model = encode_in_chunks(OpusEncoder(model_rate), samples, [model_chunk])
    irregular = encode_in_chunks(OpusEncoder(model_rate), samples, [1, 333, 0, 4096, 9001])
    assert len(whole) > 300
    assert model == whole
    assert irregular == whole


@pytest.mark.parametrize(("rate", "opus_rate"), [(16000, 16000), (44100, 48000), (48000, 48000)])
def test_rate_choice_and_pre_skip(rate: int, opus_rate: int) -> None:
    encoder = OpusEncoder(rate)
    assert encoder.sample_rate == opus_rate
    assert encoder.frame_size == opus_rate // 50
    assert encoder.frame_samples_48k == 960
    # libopus: 2.5 ms of CELT overlap + 4 ms delay compensation, i.e. 312 samples at 48 kHz
    assert encoder.pre_skip == encoder.lookahead * 48000 // opus_rate == 312
    assert (encoder.bitrate, encoder.complexity) == (32000, DEFAULT_COMPLEXITY)


def test_explicit_opus_rate_and_settings() -> None:
    encoder = OpusEncoder(44100, opus_rate=24000, bitrate=24000, complexity=5)
    assert (encoder.sample_rate, encoder.frame_size, encoder.bitrate, encoder.complexity) == (24000, 480, 24000, 5)
    assert encoder.pre_skip == encoder.lookahead * 2
    with pytest.raises(ValueError, match="Opus codes at"):
        OpusEncoder(44100, opus_rate=44100)
    with pytest.raises(ValueError, match="application"):
        OpusEncoder(48000, application="music")


def test_finish_pads_past_the_lookahead(model_rate: int, model_chunk: int, speech: Callable[[int], np.ndarray]) -> None:
    """The last real sample leaves the encoder only after ``lookahead`` more samples; finish covers that."""
    encoder = OpusEncoder(model_rate)
    samples = speech(model_rate)[:12345]
    packets = encode_in_chunks(encoder, samples, [model_chunk])
    expected_real = round(samples.size * encoder.sample_rate / model_rate)
    assert encoder.real_samples == expected_real
    assert encoder.real_samples_48k == expected_real * 48000 // encoder.sample_rate
    coded = len(packets) * encoder.frame_size
    assert expected_real + encoder.lookahead <= coded < expected_real + encoder.lookahead + encoder.frame_size
    with pytest.raises(RuntimeError, match="finished"):
        encoder.encode(samples)


def test_rejects_multichannel_chunks() -> None:
    with pytest.raises(ValueError, match="1-D"):
        OpusEncoder(48000).encode(np.zeros((2, 960), dtype=np.float32))


def decode(decoder: str, path: Path, tool: Callable[[str], str]) -> np.ndarray:
    """48 kHz float32 from ffmpeg's native decoder or from opusdec (libopus)."""
    if decoder == "ffmpeg":
        command = [tool("ffmpeg"), "-v", "error", "-c:a", "opus", "-i", str(path), "-f", "f32le", "-"]
        return np.frombuffer(subprocess.run(command, check=True, capture_output=True).stdout, dtype=np.float32)
    wav = path.with_suffix(".wav")
    subprocess.run([tool("opusdec"), "--quiet", "--rate", "48000", "--float", str(path), str(wav)], check=True)
    samples, rate = soundfile.read(wav, dtype="float32")
    assert rate == 48000
    return samples


def snr_db(reference: np.ndarray, decoded: np.ndarray) -> float:
    error = decoded - reference
    return float(10 * np.log10(np.sum(reference**2) / np.sum(error**2)))


def best_alignment(reference: np.ndarray, decoded: np.ndarray) -> tuple[float, int]:
    """(SNR, lag) maximising SNR over lags of up to MAX_LAG samples; positive lag = decoded is late."""
    inner = slice(MAX_LAG, reference.size - MAX_LAG)
    candidates = [
        (snr_db(reference[inner], decoded[inner.start + lag : inner.stop + lag]), lag)
        for lag in range(-MAX_LAG, MAX_LAG + 1)
    ]
    return max(candidates)


CASES = [
    # (bitrate, decoder, minimum SNR dB, allowed |lag| at 48 kHz)
    (64000, "ffmpeg", 16.0, 0),
    (64000, "opusdec", 16.0, 0),
    (32000, "ffmpeg", 13.0, 3),
    (32000, "opusdec", 11.0, 3),
]


@pytest.mark.parametrize(("bitrate", "decoder", "min_snr", "max_lag"), CASES)
def test_independent_decoder_matches_input(
    model_rate: int,
    model_chunk: int,
    bitrate: int,
    decoder: str,
    min_snr: float,
    max_lag: int,
    speech: Callable[[int], np.ndarray],
    split: Callable[[np.ndarray, int], list[np.ndarray]],
    tool: Callable[[str], str],
    tmp_path: Path,
) -> None:
    samples = speech(model_rate)
    encoder = make_encoder("ogg_opus", model_rate, bitrate=bitrate)
    blocks = [block for chunk in split(samples, model_chunk) for block in encoder.encode(chunk)]
    path = tmp_path / "speech.opus"
    path.write_bytes(b"".join(blocks + encoder.finish()))

    decoded = decode(decoder, path, tool)
    reference = samples if model_rate == 48000 else soxr.resample(samples, model_rate, 48000)
    assert decoded.size == reference.size, "pre-skip and end trimming must give back the input length"
    snr, lag = best_alignment(reference, decoded)
    max_error = float(np.abs(decoded - reference).max())
    report = f"{decoder}, {bitrate} b/s, {model_rate} Hz: SNR {snr:.1f} dB at lag {lag}, max error {max_error:.3f}"
    assert abs(lag) <= max_lag, report
    assert snr >= min_snr, report
    if bitrate == 64000:
        assert max_error <= 0.25, report


def test_the_default_complexity_keeps_speech_within_2_db_of_the_best(speech: Callable[[int], np.ndarray]) -> None:
    """The default sits below the CPU knee (7 costs ~5x as much, scripts/bench_opus.py); it must not cost quality."""
    samples = speech(48000)

    def quality(complexity: int) -> float:
        encoder = OpusEncoder(48000, complexity=complexity)
        packets = encoder.encode(samples) + encoder.finish()
        decoder = opuslib.Decoder(48000, 1)
        decoded = np.frombuffer(b"".join(decoder.decode_float(p, 960) for p in packets), np.float32)
        return spectral_snr_db(samples, decoded[encoder.pre_skip :])

    assert DEFAULT_COMPLEXITY <= 6
    assert quality(DEFAULT_COMPLEXITY) >= quality(10) - 2.0
    assert quality(DEFAULT_COMPLEXITY) >= 16.0
