"""A ``voxwire serve --workers 1`` frontend never imports torch or the model's code (issue 22), even after it has
served each kind of request that carries a voice or audio: a voice upload (``POST /v1/voices``), the voice
listing, ``POST /v1/audio/speech`` and a WebSocket utterance in that voice (whose second sentence continues the
first one's patches, built in the frontend), while the audio stays what the model makes alone, bit for bit. A
quick check without a server guards the modules a frontend process starts with.

How the real processes are asked: the server runs as operators run it (``python -m voxwire.cli.main serve``, the
supervisor spawning the engine and the frontend), with one addition on ``PYTHONPATH``: a ``sitecustomize`` module,
which every Python process runs at start-up, spawned children included. It installs a SIGWINCH handler that writes
``sorted(sys.modules)`` to ``<folder>/<pid>.json`` (a signal the server never uses, and one ignored by default);
nothing is added to the server itself (no debug route). After the requests, the test signals the frontend and the
engine (their pids from the supervisor's log) and reads what each has loaded. The engine's list is the control: it
must hold torch and the model, so the probe does see a real process's modules.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import numpy as np
import pytest
import soundfile
from tests.server_process import ServerProcess, poll, server_threads

from voxwire.audio.clip import load_clip
from voxwire.client.connection import Connection
from voxwire.params import SynthesisParams
from voxwire.protocol.wire import Done
from voxwire.speech_model import public_model_name
from voxwire.tts import VoxCPM
from voxwire.voice_clip import VoiceClip

from .helpers import utterance

TRANSCRIPT = "A clip of the voice."
TEXT = "The frontend speaks in a saved voice."
TWO_SENTENCES = "The first sentence is here. The second one continues its voice."
CLIP_RATE = 48000
MODEL_CODE = ("torch", "safetensors.torch", "voxwire.model", "voxwire.kernels", "voxwire.tts", "voxwire.sequence",
              "voxwire.engine.runner", "voxwire.loader")  # fmt: skip
"""Modules (and their submodules) that only a process holding the model may import."""

MODULES_HOOK = textwrap.dedent(
    """
    import json, os, signal, sys

    def _write_modules(signum, frame):
        path = os.path.join(os.environ["VOXWIRE_TEST_MODULES_DIR"], f"{os.getpid()}.json")
        with open(path + ".tmp", "w") as file:
            json.dump(sorted(sys.modules), file)
        os.replace(path + ".tmp", path)

    signal.signal(signal.SIGWINCH, _write_modules)
    """
)
"""``sitecustomize.py`` for the server's processes: SIGWINCH writes the process's loaded modules to a file."""


def is_model_side(module: str) -> bool:
    return any(module == name or module.startswith(f"{name}.") for name in MODEL_CODE)


def test_a_frontend_process_starts_without_the_model() -> None:
    """What a spawned frontend imports before serving: ``voxwire.cli.main`` (the parent's ``__main__``, imported
    again in a spawned child) and the frontend's entry module."""
    imports = "voxwire.cli.main, voxwire.serving.workers.frontend"
    code = f"import json, sys, {imports}; print(json.dumps(sorted(sys.modules)))"
    listed = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, timeout=120)
    modules = json.loads(listed.stdout)
    assert "voxwire.serving.app" in modules
    assert [module for module in modules if is_model_side(module)] == []


@pytest.fixture(scope="module")
def modules_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("modules")


@pytest.fixture(scope="module")
def server(tiny_tts: VoxCPM, modules_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    hook = tmp_path_factory.mktemp("hook")
    (hook / "sitecustomize.py").write_text(MODULES_HOOK)
    python_path = os.pathsep.join(filter(None, [str(hook), os.environ.get("PYTHONPATH")]))
    env = {"PYTHONPATH": python_path, "VOXWIRE_TEST_MODULES_DIR": str(modules_dir)}
    voices = tmp_path_factory.mktemp("voices")
    args = ("--model", tiny_tts.name, "--workers", "1", "--voices-dir", str(voices), "--encoder-threads", "1")
    with ServerProcess(*args, env=env) as process:
        process.wait_ready()
        yield process


@pytest.mark.isa
@pytest.mark.slow
def test_a_frontend_serves_voices_and_speech_without_torch(
    server: ServerProcess, tiny_tts: VoxCPM, modules_dir: Path
) -> None:
    wav = clip_wav()
    voice = asyncio.run(upload_and_list(server.url, wav))
    assert asyncio.run(listings(server.url)) == (public_model_name(tiny_tts.name), ["default", "alloy", voice])
    speech = asyncio.run(speak_over_http(server.url, voice))
    assert len(speech) > 0
    pcm, done = asyncio.run(utterance_with_voice(server.ws_url, voice, TEXT, seed=5))
    assert done.finish_reason in ("stop", "length")
    _, continued = asyncio.run(utterance_with_voice(server.ws_url, voice, TWO_SENTENCES, seed=6))
    assert continued.finish_reason in ("stop", "length") and continued.segments == 2

    # The voice went to the engine and back as numpy and travelled with the request: the audio is the model's.
    with server_threads():
        samples = load_clip(wav, tiny_tts.sample_rate)
        prompt = tiny_tts.make_prompt(VoiceClip(text=TRANSCRIPT, audio=samples, sample_rate=tiny_tts.sample_rate))
        expected = tiny_tts.generate(TEXT, SynthesisParams(seed=5), prompt=prompt)
    np.testing.assert_array_equal(np.frombuffer(pcm, "<f4"), expected)

    frontend = loaded_modules(server, "frontend", modules_dir)
    engine = loaded_modules(server, "engine", modules_dir)
    assert {"torch", "voxwire.model.voxcpm"} <= engine  # the probe sees a real process's modules
    assert "voxwire.serving.workers.frontend" in frontend and "voxwire.serving.http.voices" in frontend
    model_side = sorted(module for module in frontend if is_model_side(module))
    assert not model_side, f"the frontend loaded {len(model_side)} module(s) of the model's side: {model_side[:10]}"
    # Without OTEL_* in its environment, no process loads opentelemetry (tracing costs nothing when off).
    assert not [module for module in frontend | engine if module.partition(".")[0] == "opentelemetry"]


def clip_wav() -> bytes:
    clip = np.sin(np.linspace(0, 400 * np.pi, CLIP_RATE)).astype(np.float32) * 0.3
    wav = io.BytesIO()
    soundfile.write(wav, clip, CLIP_RATE, format="WAV")
    return wav.getvalue()


async def upload_and_list(url: str, wav: bytes) -> str:
    """Save a voice (a clip and its transcript: a continuation prompt); its id, once the listing shows it."""
    form = aiohttp.FormData()
    form.add_field("file", wav, filename="voice.wav", content_type="audio/wav")
    form.add_field("transcript", TRANSCRIPT)
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}/v1/voices", data=form) as response:
            assert response.status == 201, await response.text()
            voice = str((await response.json())["id"])
        async with session.get(f"{url}/v1/voices") as response:
            assert response.status == 200
            assert voice in {listed["id"] for listed in (await response.json())["data"]}
    return voice


async def listings(url: str) -> tuple[str, list[str]]:
    """What a frontend lists (``GET /v1/models``, ``GET /v1/audio/voices``: built-in voices and the saved one), each
    response naming its request; the model's id and a sample of the voice ids: ``default``, ``alloy``, the saved."""
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{url}/v1/models") as response:
            assert response.status == 200 and response.headers["X-Request-Id"].startswith("req_")
            (model,) = [listed["id"] for listed in (await response.json())["data"]]
        async with session.get(f"{url}/v1/audio/voices", headers={"X-Request-Id": "frontend-1"}) as response:
            assert response.status == 200 and response.headers["X-Request-Id"] == "frontend-1"
            voices = (await response.json())["voices"]
    builtin = [listed["id"] for listed in voices if listed["builtin"]]
    saved = [listed["id"] for listed in voices if not listed["builtin"]]
    return model, [builtin[0], builtin[1], *saved]


async def speak_over_http(url: str, voice: str) -> bytes:
    body = {"model": "voxwire", "input": TEXT, "voice": voice, "response_format": "pcm", "seed": 3}
    async with aiohttp.ClientSession() as session, session.post(f"{url}/v1/audio/speech", json=body) as response:
        assert response.status == 200, await response.text()
        return await response.read()


async def utterance_with_voice(url: str, voice: str, text: str, seed: int) -> tuple[bytes, Done]:
    async with await Connection.open(url, None) as connection:
        return await utterance(connection, text, seed, voice=voice)


def loaded_modules(server: ServerProcess, role: str, folder: Path) -> set[str]:
    """The modules process ``role`` (``frontend`` or ``engine``, index 0) has loaded now, asked by SIGWINCH."""
    pid = server_pid(server, role)
    os.kill(pid, signal.SIGWINCH)
    path = folder / f"{pid}.json"
    assert poll(path.exists, timeout=10), f"the {role} (pid {pid}) wrote no module list:\n{server.log}"
    return set(json.loads(path.read_text()))


def server_pid(server: ServerProcess, role: str) -> int:
    found = re.search(rf"{role} 0 started.*\(pid (\d+)\)", server.log)
    assert found is not None, server.log
    return int(found.group(1))
