"""Benchmark (not a test): what the server adds on top of the engine, and what encoding costs.

    python scripts/bench_server.py [--sessions 1,32] [--utterances 3] [--encode-only]

1. Server overhead: the real app runs in process on a free port with the tiny ``voxcpm2`` model (CPU);
   n WebSocket clients each speak short utterances (one sentence, ``end`` right after). For every
   utterance, the ``done`` message reports ``ttfa_s`` (first text received to first audio frame sent),
   ``buffer_s`` (waiting for a complete sentence) and ``engine_ttfc_s`` (the engine's own time to its
   first chunk); the server's overhead is ``ttfa_s - buffer_s - engine_ttfc_s``: parsing, segmenting,
   queueing into the engine thread, encoding and handing the first frame to the socket.
2. Encode cost: a per-session encoder fed model-sized chunks (the path every streamed chunk takes), in
   milliseconds of CPU per second of audio, at each model output rate: Opus (the WebSocket default) and
   the PyAV formats of the HTTP API (mp3, aac, flac).
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import websockets
from aiohttp import web

import voxwire
from voxwire.audio.formats import AudioFormat, make_encoder
from voxwire.protocol import wire as protocol
from voxwire.serving.app import make_app
from voxwire.serving.runtime.keys import STATE_KEY
from voxwire.serving.server_config import ServerConfig
from voxwire.speech_model import VoxCPMSpeech
from voxwire.tiny.checkpoint import make_tiny_checkpoint


async def client(url: str, utterances: int, seed: int) -> list[protocol.Done]:
    done: list[protocol.Done] = []
    async with websockets.connect(url, max_size=None) as ws:
        await ws.recv()  # ready
        for index in range(utterances):
            await ws.send(protocol.encode(protocol.Start(seed=seed + index)))
            await ws.send(protocol.encode(protocol.Text(text="A short reply to measure the server. ")))
            await ws.send(protocol.encode(protocol.End()))
            while True:
                message = await ws.recv()
                if isinstance(message, str):
                    decoded = protocol.decode_server(message)
                    if isinstance(decoded, protocol.Done):
                        done.append(decoded)
                        break
    return done


async def server_overhead(sessions: list[int], utterances: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        tts = voxwire.load_model(make_tiny_checkpoint(Path(tmp) / "voxcpm2", "voxcpm2"), device="cpu")
    port = _free_port()
    config = ServerConfig.of(
        port=port, max_sessions=max(sessions), max_waiting=4 * max(sessions), max_connections=4 * max(sessions)
    )
    app = make_app(config, model=VoxCPMSpeech(tts))
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    while not app[STATE_KEY].accepting:
        await asyncio.sleep(0.05)
    url = f"ws://127.0.0.1:{port}/v1/tts/stream"
    print("| sessions | TTFA median (ms) | engine TTFC median (ms) | server overhead median (ms) | p90 (ms) |")
    print("|---|---|---|---|---|")
    try:
        for count in sessions:
            results = await asyncio.gather(*(client(url, utterances, 100 * i) for i in range(count)))
            dones = [d for per_client in results for d in per_client if d.ttfa_s is not None]
            overhead = [d.ttfa_s - d.buffer_s - d.engine_ttfc_s for d in dones]
            ttfa = [d.ttfa_s for d in dones]
            engine = [d.engine_ttfc_s for d in dones]
            print(
                f"| {count} | {statistics.median(ttfa) * 1e3:.1f} | {statistics.median(engine) * 1e3:.1f} | "
                f"{statistics.median(overhead) * 1e3:.2f} | {np.percentile(overhead, 90) * 1e3:.2f} |",
                flush=True,
            )
    finally:
        await runner.cleanup()


ENCODED_FORMATS = (AudioFormat.OPUS, AudioFormat.MP3, AudioFormat.AAC, AudioFormat.FLAC)


def encode_cost(seconds: float = 10.0) -> None:
    names = " | ".join(fmt.value for fmt in ENCODED_FORMATS)
    print(f"\n| model rate | samples per chunk | {names} (ms of CPU per audio second) |")
    print("|---|---|" + "---|" * len(ENCODED_FORMATS))
    rng = np.random.default_rng(0)
    for rate, chunk in ((16000, 1280), (44100, 7056), (48000, 7680)):
        t = np.arange(int(seconds * rate)) / rate
        audio = (
            0.3 * np.sin(2 * np.pi * 180 * t) * (1 + np.sin(2 * np.pi * 3 * t)) / 2 + 0.02 * rng.standard_normal(t.size)
        ).astype(np.float32)
        costs = []
        for fmt in ENCODED_FORMATS:
            encoder = make_encoder(fmt, rate)
            start = time.process_time()
            for begin in range(0, audio.size, chunk):
                encoder.encode(audio[begin : begin + chunk])
            encoder.finish()
            costs.append(f"{(time.process_time() - start) / seconds * 1e3:.1f}")
        print(f"| {rate} | {chunk} | {' | '.join(costs)} |")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description="server overhead and encode cost")
    parser.add_argument("--sessions", default="1,32")
    parser.add_argument("--utterances", type=int, default=3, help="utterances per client")
    parser.add_argument("--encode-only", action="store_true", help="only the encode cost table")
    args = parser.parse_args()
    if not args.encode_only:
        asyncio.run(server_overhead([int(s) for s in args.sessions.split(",")], args.utterances))
    encode_cost()


if __name__ == "__main__":
    main()
