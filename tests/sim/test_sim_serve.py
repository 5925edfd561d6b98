"""``voxwire serve --model sim``: the real server over the simulated runner streams the clip as Opus."""

from __future__ import annotations

import asyncio

import numpy as np
import opuslib
import pytest
from tests.server_process import ServerProcess

from voxwire.audio.opus import DEFAULT_COMPLEXITY, OpusEncoder
from voxwire.audio.quality import spectral_snr_db
from voxwire.client.connection import Connection
from voxwire.engine import Engine, EngineConfig, Request, SynthesisParams
from voxwire.protocol.wire import AudioFrame, Done, End, Start, Text
from voxwire.sim.model import speech_clip
from voxwire.sim.runner import SimConfig, SimRunner

TEXT = "Load tests need speech that sounds like speech."
SEED = 11


def expected_audio() -> np.ndarray:
    """What the simulated model says for ``TEXT`` and ``SEED``, without a server."""
    engine = Engine(SimRunner(speech_clip(48000), 1, SimConfig(), sleep=lambda _: None), EngineConfig(max_running=1))
    engine.add(Request("a", TEXT, SynthesisParams(seed=SEED)))
    chunks = []
    while engine.has_unfinished():
        chunks += [output.audio for output in engine.step()]
    return np.concatenate(chunks)


async def speak(url: str, fmt: str) -> tuple[list[AudioFrame], Done, int]:
    async with await Connection.open(url) as connection:
        ready = await connection.configure(Start(format=fmt, seed=SEED))
        await connection.send(Text(TEXT))
        await connection.send(End())
        frames: list[AudioFrame] = []
        while True:
            message = await asyncio.wait_for(connection.receive(), 30)
            if isinstance(message, AudioFrame):
                frames.append(message)
            elif isinstance(message, Done):
                return frames, message, ready.pre_skip


def opus_packets(audio: np.ndarray, complexity: int) -> list[bytes]:
    encoder = OpusEncoder(48000, complexity=complexity)
    return encoder.encode(audio) + encoder.finish()


def decode_opus(packets: list[bytes], pre_skip: int) -> np.ndarray:
    decoder = opuslib.Decoder(48000, 1)
    pcm = b"".join(decoder.decode_float(packet, 960) for packet in packets)
    return np.frombuffer(pcm, dtype=np.float32)[pre_skip:]


@pytest.mark.slow
def test_serve_model_sim_streams_the_clip_as_real_speech_opus() -> None:
    expected = expected_audio()
    with ServerProcess("--model", "sim", "--sim-cost", "5ms+0.1ms/row", "--opus-complexity", "3") as server:
        server.wait_ready()
        frames, done, pre_skip = asyncio.run(speak(server.ws_url, "opus"))
        pcm_frames, _, _ = asyncio.run(speak(server.ws_url, "pcm_f32le"))
        assert server.stop() == 0
    assert done.finish_reason == "stop" and done.audio_s == pytest.approx(expected.size / 48000)
    # Bit-exact as PCM: the served audio is the simulated model's.
    assert np.array_equal(np.frombuffer(b"".join(p for f in pcm_frames for p in f.packets), "<f4"), expected)
    packets = [packet for frame in frames for packet in frame.packets]
    # --opus-complexity reaches the encoder: the packets are those of a complexity-3 encoder, not the default's.
    assert packets == opus_packets(expected, complexity=3) != opus_packets(expected, DEFAULT_COMPLEXITY)
    decoded = decode_opus(packets, pre_skip)[: expected.size]
    # Opus keeps speech's spectrum (~20 dB at 32 kb/s); another stretch of the clip or silence scores ~0 dB.
    assert spectral_snr_db(expected, decoded) > 12
