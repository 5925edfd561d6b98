"""A finished stream as a file (``formats.whole_file``): a WAV and a FLAC state their real length, so Python's
``wave`` and ``soundfile`` read them whole; a streamed one keeps its unknown-size header, and what reads it is
pinned here (docs/http-api.md says the same)."""

from __future__ import annotations

import io
import wave

import av
import numpy as np
import pytest
import soundfile

from voxwire.audio.formats import AudioFormat, make_encoder, output_rates, whole_file
from voxwire.audio.pcm import UNKNOWN_SIZE

INPUT_RATE = 16000
OUTPUT_RATE = 24000
SECONDS = 0.5
FRAMES = int(OUTPUT_RATE * SECONDS)
"""What the resampler gives for SECONDS of input at INPUT_RATE (``StreamResampler``: n_out = n_in * ratio)."""


def speech_like() -> np.ndarray:
    t = np.arange(int(INPUT_RATE * SECONDS)) / INPUT_RATE
    return (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)


def encoded(fmt: str, *, speed: float = 1.0) -> tuple[bytes, bytes]:
    """(the streamed body, the same as a whole file), encoded in two chunks."""
    encoder = make_encoder(fmt, INPUT_RATE, output_rate=OUTPUT_RATE, speed=speed)
    samples = speech_like()
    blocks = [*encoder.encode(samples[:3000]), *encoder.encode(samples[3000:]), *encoder.finish()]
    body = b"".join(blocks)
    return body, whole_file(encoder, body)


def test_a_whole_wav_states_its_frames_and_a_streamed_one_the_unknown_size() -> None:
    streamed, whole = encoded("wav")
    with wave.open(io.BytesIO(whole)) as reader:
        assert (reader.getnframes(), reader.getframerate()) == (FRAMES, OUTPUT_RATE)
    assert whole[44:] == streamed[44:]  # the samples are the streamed ones
    assert int.from_bytes(streamed[40:44], "little") == UNKNOWN_SIZE


def test_a_whole_wav_at_another_speed_states_its_frames() -> None:
    _, whole = encoded("wav", speed=2.0)
    with wave.open(io.BytesIO(whole)) as reader:
        assert reader.getnframes() == (len(whole) - 44) // 2


def test_a_whole_flac_is_read_by_soundfile_as_its_samples() -> None:
    streamed, whole = encoded("flac")
    info = soundfile.info(io.BytesIO(whole))
    assert (info.frames, info.samplerate) == (FRAMES, OUTPUT_RATE)
    samples, _ = soundfile.read(io.BytesIO(whole), dtype="int16")
    pcm, _ = encoded("pcm_s16le")
    np.testing.assert_array_equal(samples, np.frombuffer(pcm, dtype="<i2"))  # lossless: the pcm samples
    assert len(whole) == len(streamed)


def test_a_streamed_flac_is_decoded_whole_by_ffmpeg_but_not_by_soundfile() -> None:
    """What docs/http-api.md promises for a streamed FLAC: FFmpeg (PyAV) decodes every sample; soundfile cannot."""
    streamed, _ = encoded("flac")
    with av.open(io.BytesIO(streamed)) as container:
        assert sum(frame.samples for frame in container.decode(audio=0)) == FRAMES
    assert soundfile.info(io.BytesIO(streamed)).frames != FRAMES  # libsndfile takes the unknown count as endless
    with pytest.raises((soundfile.LibsndfileError, ValueError)):  # it cannot seek in it, or allocate "all"
        soundfile.read(io.BytesIO(streamed))


@pytest.mark.parametrize("fmt", ["mp3", "pcm_s16le"])
def test_formats_without_a_length_are_unchanged(fmt: str) -> None:
    streamed, whole = encoded(fmt)
    assert whole == streamed


@pytest.mark.parametrize(
    ("fmt", "rate", "taken"),
    [
        (AudioFormat.PCM_S16LE, 16000, True),
        (AudioFormat.WAV, 11025, True),
        (AudioFormat.FLAC, 44100, True),
        (AudioFormat.PCM_S16LE, 7999, False),
        (AudioFormat.OGG_OPUS, 16000, True),
        (AudioFormat.OGG_OPUS, 44100, False),
        (AudioFormat.MP3, 22050, True),
        (AudioFormat.MP3, 96000, False),
        (AudioFormat.AAC, 96000, True),
        (AudioFormat.PCM_MULAW, 8000, True),
        (AudioFormat.PCM_ALAW, 16000, False),
    ],
)
def test_each_format_says_the_rates_it_takes(fmt: AudioFormat, rate: int, taken: bool) -> None:
    assert (rate in output_rates(fmt)) is taken
    if taken:  # the encoder makes the rate it promises
        assert make_encoder(fmt, INPUT_RATE, output_rate=rate).sample_rate == rate
