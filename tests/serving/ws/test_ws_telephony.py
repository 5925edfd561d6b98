"""Telephony output on the WebSocket: ``start.sample_rate`` for PCM formats, G.711 mu-law and A-law (8 kHz unless
asked otherwise), and audio as base64 in JSON ``audio`` messages. The audio is checked the way a gateway would
hear it: decoded by FFmpeg from the bytes the socket carried, at the rate ``ready`` announced, against the engine's
own audio for the seed resampled to that rate. Thresholds: G.711 is 8-bit companding, measured 36.7 (mu-law) and
37.4 dB (A-law) at 8 kHz, so 30 dB; 16-bit PCM measured 75-82 dB, so 60 dB; f32 is exact."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

import numpy as np
import pytest
import soxr
from aiohttp import WSMsgType

from voxwire.protocol.wire import Audio, End, Ready, Start, Text, decode_server

from .conftest import Connect, StreamClient, require
from .helpers import engine_audio, snr_db

pytestmark = pytest.mark.asyncio

TEXT = "Hello there."
FFMPEG_FORMAT = {"pcm_mulaw": "mulaw", "pcm_alaw": "alaw", "pcm_s16le": "s16le", "pcm_f32le": "f32le"}


async def speak_raw(stream: StreamClient, text: str, **settings: object) -> tuple[Ready, list[str], list[bytes]]:
    """Speak one utterance; the ``ready``, then every text frame and binary frame up to ``done``, undecoded."""
    await stream.send(Start(**settings))  # type: ignore[arg-type]
    ready = await stream.expect(Ready)
    await stream.send(Text(text))
    await stream.send(End())
    texts: list[str] = []
    binary: list[bytes] = []
    while not texts or decode_server(texts[-1]).type != "done":
        message = await stream.ws.receive(timeout=60)
        if message.type is WSMsgType.BINARY:
            binary.append(message.data)
        else:
            texts.append(message.data)
    return ready, texts, binary


def payloads(binary: list[bytes]) -> bytes:
    """The audio of binary frames, read as the protocol says: skip each frame's ``header_size`` bytes."""
    return b"".join(frame[int.from_bytes(frame[2:4], "little") :] for frame in binary)


def ffmpeg_decode(data: bytes, fmt: str, rate: int) -> np.ndarray:
    command = [require("ffmpeg"), "-v", "error", "-f", FFMPEG_FORMAT[fmt], "-ar", str(rate), "-ac", "1", "-i", "-"]
    run = subprocess.run([*command, "-f", "f32le", "-"], input=data, check=True, capture_output=True)
    return np.frombuffer(run.stdout, dtype=np.float32)


@pytest.mark.parametrize(
    ("fmt", "rate", "expected_rate", "min_snr_db"),
    [
        ("pcm_mulaw", None, 8000, 30.0),
        ("pcm_alaw", None, 8000, 30.0),
        ("pcm_mulaw", 16000, 16000, 30.0),
        ("pcm_s16le", 8000, 8000, 60.0),
        ("pcm_s16le", 22050, 22050, 60.0),
        ("pcm_f32le", 24000, 24000, 60.0),
    ],
)
async def test_pcm_at_the_asked_rate_decodes_to_the_engines_speech(
    ws_server: Callable, connect: Connect, fmt: str, rate: int | None, expected_rate: int, min_snr_db: float
) -> None:
    server = await ws_server()
    stream = await connect(server)
    ready, texts, binary = await speak_raw(stream, TEXT, format=fmt, sample_rate=rate, seed=7)
    assert (ready.format, ready.sample_rate) == (fmt, expected_rate)
    decoded = ffmpeg_decode(payloads(binary), fmt, expected_rate)
    reference = soxr.resample(await engine_audio(server, TEXT, seed=7), 48000, expected_rate)
    done = decode_server(texts[-1])
    assert done.type == "done" and abs(done.audio_s * expected_rate - decoded.size) <= 1
    assert abs(decoded.size - reference.size) <= 1, (decoded.size, reference.size)
    size = min(decoded.size, reference.size)
    with np.errstate(divide="ignore"):  # f32 at a rate soxr resamples identically in one go: no error at all
        snr = snr_db(reference[:size], decoded[:size])
    assert snr >= min_snr_db, f"{fmt} at {expected_rate} Hz: SNR {snr:.1f} dB"


async def test_json_audio_messages_carry_the_same_bytes_as_binary_frames(ws_server: Callable, connect: Connect) -> None:
    server = await ws_server()
    stream = await connect(server)
    settings = {"format": "pcm_mulaw", "sample_rate": 8000, "seed": 5}
    _, _, binary = await speak_raw(stream, TEXT, **settings)
    _, texts, none = await speak_raw(stream, TEXT, audio_transport="json", **settings)
    messages = [decode_server(text) for text in texts]
    audio = [message for message in messages if isinstance(message, Audio)]
    assert none == [], "no binary frame when audio travels as JSON"
    assert audio and all(m.format == "pcm_mulaw" and m.utterance == 1 for m in audio)
    assert [m.sequence for m in audio] == list(range(len(audio)))
    assert b"".join(m.frame().packets[0] for m in audio) == payloads(binary)
    assert [m.type for m in messages][-1] == "done"


@pytest.mark.parametrize(
    "settings",
    [
        {"format": "opus", "sample_rate": 16000},
        {"sample_rate": 8000},
        {"format": "pcm_s16le", "sample_rate": 11025},
        {"audio_transport": "base64"},
    ],
)
async def test_a_rate_or_transport_the_server_does_not_offer_is_a_typed_error(
    ws_server: Callable, connect: Connect, settings: dict[str, object]
) -> None:
    server = await ws_server()
    stream = await connect(server)
    before = stream.ready
    await stream.send(Start(**settings))  # type: ignore[arg-type]
    await stream.error("out_of_range")
    await stream.send(Start(format="pcm_alaw"))
    ready = await stream.expect(Ready)
    assert before is not None and (ready.format, ready.sample_rate) == ("pcm_alaw", 8000)
