"""What a WebSocket client hears: the engine's exact samples in PCM (equal to ``generate()`` for the seed),
and Opus that an independent decoder (ffmpeg) turns back into the same audio, with no seam where chunks
or sentences meet.

Thresholds (Opus at the default 32 kb/s, decoded by ffmpeg at 48 kHz):

* real speech (an espeak-ng clip played by ``ClipService`` through the socket): SNR >= 13 dB at the best
  lag within 3 samples, the bound the encoder's own tests hold (measured here 17.3, 17.1 and 21.9 dB at
  lag 0 for 48, 44.1 and 16 kHz models); within 5 ms of every chunk boundary the SNR stays within 3 dB
  of the whole clip's (measured 17.1, 18.0, 23.2 dB: no clicks);
* the tiny random model (noise, which Opus codes by band energy, not waveform): every 20 ms frame's
  energy within 3 dB of the engine's (worst measured 1.7 dB), and the socket's packets byte-identical
  to one encoder fed the engine's audio, so chunking and sentence boundaries cannot add a seam.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import soxr

from voxwire.audio.ogg import OggOpusMuxer
from voxwire.audio.opus import DEFAULT_BITRATE, OpusEncoder
from voxwire.audio.pcm import to_s16le
from voxwire.engine import SynthesisParams
from voxwire.protocol.wire import End, Ready, Start, Text
from voxwire.tts import VoxCPM

from .conftest import ClipService, Connect, Heard, StreamClient, clip_app, require
from .helpers import engine_audio, snr_db

pytestmark = pytest.mark.asyncio

TEXT = "Hello there."
TWO_SENTENCES = "Hello there. How are you today?"
MAX_LAG = 3
FRAME = 960
"""20 ms at 48 kHz."""


async def speak(stream: StreamClient, text: str, **settings: object) -> Heard:
    await stream.send(Start(**settings))  # type: ignore[arg-type]
    await stream.expect(Ready)
    await stream.send(Text(text))
    await stream.send(End())
    return await stream.heard()


def decode_packets(packets: list[bytes], pre_skip: int, samples_48k: int, tmp_path: Path) -> np.ndarray:
    """Raw Opus packets -> 48 kHz float32 through ffmpeg (wrapped in Ogg only to give ffmpeg a container)."""
    muxer = OggOpusMuxer(pre_skip=pre_skip, input_rate=48000, serial=1)
    body = muxer.pages(packets[:-1]) + muxer.finish(packets[-1:], playable_samples_48k=samples_48k)
    path = tmp_path / "socket.opus"
    path.write_bytes(b"".join(body))
    command = [require("ffmpeg"), "-v", "error", "-c:a", "opus", "-i", str(path), "-f", "f32le", "-"]
    return np.frombuffer(subprocess.run(command, check=True, capture_output=True).stdout, dtype=np.float32)


def one_encoder(audio: np.ndarray, rate: int, chunk: int) -> list[bytes]:
    encoder = OpusEncoder(rate, bitrate=DEFAULT_BITRATE)
    chunks = [audio[start : start + chunk] for start in range(0, audio.size, chunk)]
    return [packet for piece in chunks for packet in encoder.encode(piece)] + encoder.finish()


@pytest.mark.isa
@pytest.mark.parametrize(("fmt", "convert"), [("pcm_f32le", None), ("pcm_s16le", to_s16le)])
async def test_pcm_is_the_engines_audio_for_the_seed(
    ws_server: Callable, connect: Connect, tiny_tts: VoxCPM, fmt: str, convert: Callable | None
) -> None:
    server = await ws_server()
    stream = await connect(server)
    heard = await speak(stream, TEXT, format=fmt, seed=11)
    expected = await engine_audio(server, TEXT, seed=11)

    assert stream.ready is not None and stream.ready.sample_rate == tiny_tts.sample_rate == 48000
    if convert is None:
        np.testing.assert_array_equal(heard.pcm(), expected)
        # Alone in the engine on CPU, a request is bit-exact with the one-utterance API.
        np.testing.assert_array_equal(heard.pcm(), tiny_tts.generate(TEXT, SynthesisParams(seed=11)))
    else:
        assert b"".join(heard.packets) == convert(expected)
    assert heard.done is not None and heard.done.finish_reason in ("stop", "length")
    assert (heard.done.segments, heard.done.audio_s) == (1, expected.size / 48000)
    assert [(s.utterance, s.index, s.text, s.start_sample) for s in heard.segments] == [(0, 0, TEXT, 0)]
    assert [(f.utterance, f.sequence) for f in heard.frames] == [(0, i) for i in range(len(heard.frames))]


async def test_opus_from_the_model_is_one_seamless_stream(
    ws_server: Callable, connect: Connect, tmp_path: Path
) -> None:
    server = await ws_server()
    stream = await connect(server)
    opus = await speak(stream, TWO_SENTENCES, format="opus", seed=5)
    ready = stream.ready
    pcm = await speak(stream, TWO_SENTENCES, format="pcm_f32le", seed=5)  # the same two engine requests
    audio = pcm.pcm()
    assert ready is not None and ready.pre_skip > 0 and len(opus.segments) == 2
    assert opus.done is not None and opus.done.audio_s == pcm.done.audio_s  # type: ignore[union-attr]

    # Across chunks and across the two sentences the socket carries what one encoder makes of the audio.
    assert opus.packets == one_encoder(audio, 48000, 7680)

    decoded = decode_packets(opus.packets, ready.pre_skip, audio.size, tmp_path)
    assert decoded.size == audio.size
    frames = audio.size // FRAME
    energy = [10 * np.log10(np.mean(x[: frames * FRAME].reshape(frames, FRAME) ** 2, axis=1)) for x in (audio, decoded)]
    worst = float(np.max(np.abs(energy[0] - energy[1])))
    assert worst <= 3.0, f"a 20 ms frame's energy is off by {worst:.2f} dB"


@pytest.mark.parametrize(("rate", "patch"), [(48000, 7680), (44100, 7056), (16000, 1280)])
async def test_opus_over_the_socket_decodes_to_the_speech_that_went_in(
    aiohttp_server: Callable,
    connect: Connect,
    speech: Callable[[int], np.ndarray],
    tmp_path: Path,
    rate: int,
    patch: int,
) -> None:
    clip = speech(rate)
    server = await aiohttp_server(clip_app(ClipService(clip, rate, patch)))
    stream = await connect(server)
    heard = await speak(stream, "Anything at all.", format="opus")
    ready = stream.ready
    assert ready is not None and ready.sample_rate == (16000 if rate == 16000 else 48000)
    assert heard.packets == one_encoder(clip, rate, patch)

    reference = clip if rate == 48000 else soxr.resample(clip, rate, 48000)
    decoded = decode_packets(heard.packets, ready.pre_skip, reference.size, tmp_path)
    assert decoded.size == reference.size
    inner = slice(MAX_LAG, reference.size - MAX_LAG)
    snr, lag = max(
        (snr_db(reference[inner], decoded[inner.start + lag : inner.stop + lag]), lag)
        for lag in range(-MAX_LAG, MAX_LAG + 1)
    )
    assert snr >= 13.0, f"SNR {snr:.1f} dB at lag {lag}"
    boundaries = np.arange(patch, clip.size - patch, patch) * 48000 // rate
    near = np.concatenate([np.arange(b - 240, b + 240) for b in boundaries])
    local = snr_db(reference[near], decoded[near + lag])
    assert local >= snr - 3.0, f"around chunk boundaries {local:.1f} dB against {snr:.1f} dB overall"


async def test_ogg_opus_utterances_are_valid_streams_of_the_right_length(
    ws_server: Callable, connect: Connect, tmp_path: Path
) -> None:
    server = await ws_server()
    stream = await connect(server)
    for utterance in range(2):
        heard = await speak(stream, TEXT, format="ogg_opus", seed=3)
        assert {frame.utterance for frame in heard.frames} == {utterance}
        path = tmp_path / f"utterance{utterance}.opus"
        path.write_bytes(b"".join(heard.packets))
        subprocess.run([require("opusinfo"), str(path)], check=True, capture_output=True)
        command = [require("ffmpeg"), "-v", "error", "-i", str(path), "-f", "f32le", "-"]
        decoded = subprocess.run(command, check=True, capture_output=True).stdout
        assert heard.done is not None and len(decoded) // 4 == round(heard.done.audio_s * 48000)
