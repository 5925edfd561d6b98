"""What the tests of ``voxwire serve --workers`` share: the key their servers take, texts to speak, one utterance
over a connection, a voice uploaded over plain HTTP, and what the supervisor's log and ``/metrics`` say."""

from __future__ import annotations

import asyncio
import io
import json
import re
import urllib.request

import numpy as np
import soundfile
from tests.server_process import ServerProcess

from voxwire.client.connection import Connection
from voxwire.protocol.wire import AudioFrame, Done, End, Start, Text

KEY = "secret"
TEXT = "Two processes speak as one."
LONG = " ".join(["This sentence keeps the simulated engine busy for a while."] * 6)


async def speak(url: str, text: str, seed: int, fmt: str = "pcm_f32le", token: str | None = KEY) -> tuple[bytes, Done]:
    async with await Connection.open(url, token) as connection:
        return await utterance(connection, text, seed, fmt)


async def utterance(
    connection: Connection, text: str, seed: int, fmt: str = "pcm_f32le", voice: str | None = None
) -> tuple[bytes, Done]:
    await connection.configure(Start(format=fmt, seed=seed, voice=voice))
    await connection.send(Text(text))
    await connection.send(End())
    audio = []
    while True:
        message = await asyncio.wait_for(connection.receive(), 60)
        if isinstance(message, AudioFrame):
            audio += message.packets
        elif isinstance(message, Done):
            return b"".join(audio), message


def metric(text: str, name: str) -> float:
    """The sum of the samples of ``name`` over every label set (e.g. every engine)."""
    found = re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE)
    return sum(float(value) for value in found)


def frontend_pids(process: ServerProcess) -> dict[int, int]:
    """Frontend index -> pid of its latest process, from the supervisor's log."""
    return {int(i): int(pid) for i, pid in re.findall(r"frontend (\d+) started \(pid (\d+)\)", process.log)}


def upload_voice(server: ServerProcess, clip: np.ndarray) -> str:
    wav = io.BytesIO()
    soundfile.write(wav, clip, 48000, format="WAV")
    boundary = "voxwiretestboundary"
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="v.wav"\r\n'
            "Content-Type: audio/wav\r\n\r\n"
        ).encode()
        + wav.getvalue()
        + f"\r\n--{boundary}--\r\n".encode()
    )
    request = urllib.request.Request(f"{server.url}/v1/voices", data=body, method="POST")
    request.add_header("Content-Type", f"multipart/form-data; boundary={boundary}")
    request.add_header("Authorization", f"Bearer {KEY}")
    with urllib.request.urlopen(request, timeout=60) as response:
        return str(json.loads(response.read())["id"])
