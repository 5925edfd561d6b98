"""LoRA personas with ``--workers 2`` and ``--devices cpu,cpu``: the engine processes own the personas, every
frontend loads, lists and removes them over IPC, and a persona speaks the same on every frontend and engine
as in one process (same seed, same audio), with the single-process server's typed errors."""

from __future__ import annotations

import asyncio
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from tests.server_process import ServerProcess, poll, server_threads
from tests.serving.conftest import LORA
from tests.workers.helpers import KEY, metric

import voxwire
from voxwire.client.connection import Connection
from voxwire.client.errors import ServerError
from voxwire.params import SynthesisParams
from voxwire.protocol.wire import AudioFrame, Done, End, Start, Text
from voxwire.tts import VoxCPM

pytestmark = pytest.mark.slow

TEXT = "Hello there."
_WS_ACCESS = re.compile(r'\[frontend-(\d+)\]: \S+ "GET /v1/tts/stream')


@pytest.fixture(scope="module")
def other_lora(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Persona B: the layers of ``LORA`` with other weights."""
    folder = tmp_path_factory.mktemp("loras") / "b"
    shutil.copytree(LORA, folder)
    state = load_file(str(folder / "lora_weights.safetensors"))
    save_file({k: (-0.7 * v).contiguous() for k, v in state.items()}, str(folder / "lora_weights.safetensors"))
    return folder


@pytest.fixture(scope="module")
def reference(persona_tts: VoxCPM, other_lora: Path) -> VoxCPM:
    """The served checkpoint in this process, with A and B: what one process speaks for each persona."""
    tts = voxwire.load_model(persona_tts.name, device="cpu", dtype=torch.float32)
    tts.enable_personas(4, 16)
    tts.load_persona("A", LORA)
    tts.load_persona("B", other_lora)
    return tts


OTHER_KEY = "another-secret"


def persona_server(persona_tts: VoxCPM, lora_root: Path, *extra: str) -> ServerProcess:
    args = ("--model", persona_tts.name, "--dtype", "float32", "--max-lora-rank", "16", "--max-loras", "2")
    args += ("--lora", f"A={LORA}", "--lora-root", str(lora_root), "--encoder-threads", "1")
    return ServerProcess(*args, *extra, env={"VOXWIRE_API_KEYS": f"{KEY},{OTHER_KEY}"})


@pytest.fixture(scope="module")
def server(persona_tts: VoxCPM, other_lora: Path) -> Iterator[ServerProcess]:
    with persona_server(persona_tts, other_lora.parent, "--workers", "2", "--max-sessions", "4") as process:
        process.wait_ready()
        yield process


async def speak_as(url: str, persona: str | None, seed: int) -> bytes:
    """One utterance of ``TEXT`` in ``persona`` on a fresh connection; its pcm_f32le audio."""
    async with await Connection.open(url, KEY) as connection:
        await connection.configure(Start(format="pcm_f32le", seed=seed, persona=persona))
        await connection.send(Text(TEXT))
        await connection.send(End())
        audio = []
        while not isinstance(message := await asyncio.wait_for(connection.receive(), 60), Done):
            if isinstance(message, AudioFrame):
                audio += message.packets
        assert message.finish_reason in ("stop", "length")
        return b"".join(audio)


def ws_sessions(server: ServerProcess) -> collections.Counter[str]:
    """WebSocket sessions each frontend has finished so far (from its access log)."""
    return collections.Counter(_WS_ACCESS.findall(server.log))


def on_each_frontend(server: ServerProcess, persona: str, tries: int = 16) -> dict[str, bytes]:
    """Speak with ``persona`` on fresh connections, one at a time, until both frontends have served one (the
    kernel spreads connections at random); the audio each frontend spoke (seed 5)."""
    heard: dict[str, bytes] = {}
    for _ in range(tries):
        before = ws_sessions(server)
        audio = asyncio.run(speak_as(server.ws_url, persona, seed=5))
        assert poll(lambda: ws_sessions(server).total() > before.total(), timeout=10), server.log  # noqa: B023
        [frontend] = (ws_sessions(server) - before).keys()
        heard[frontend] = audio
        if len(heard) == 2:
            return heard
    raise AssertionError(f"{tries} connections all landed on frontend {list(heard)}")


def call(server: ServerProcess, method: str, path: str, body: object = None, key: str = KEY) -> tuple[int, object]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(server.url + path, data=data, method=method)
    request.add_header("Authorization", f"Bearer {key}")
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def error_code(answer: object) -> str:
    assert isinstance(answer, dict)
    return str(answer["error"]["code"])


def names(server: ServerProcess) -> list[str]:
    status, listed = call(server, "GET", "/v1/loras")
    assert status == 200 and isinstance(listed, dict)
    return [persona["name"] for persona in listed["data"]]


@pytest.mark.isa
def test_a_persona_from_the_command_line_speaks_as_in_one_process_on_every_frontend(
    server: ServerProcess, reference: VoxCPM
) -> None:
    with server_threads():
        expected = reference.generate(TEXT, SynthesisParams(seed=5), lora="A")
    for audio in on_each_frontend(server, "A").values():
        np.testing.assert_array_equal(np.frombuffer(audio, "<f4"), expected)


@pytest.mark.isa
def test_a_persona_registered_through_one_frontend_serves_on_every_frontend_until_deleted(
    server: ServerProcess, reference: VoxCPM, other_lora: Path
) -> None:
    status, added = call(server, "POST", "/v1/loras", {"name": "B", "path": str(other_lora)})
    assert status == 201 and isinstance(added, dict)
    assert (added["name"], added["path"], added["rank"], added["in_use"]) == ("B", "b", 8, 0)
    for _ in range(6):  # fresh connections: either frontend lists it
        assert names(server) == ["A", "B"]
    with server_threads():
        expected = reference.generate(TEXT, SynthesisParams(seed=5), lora="B")
    for audio in on_each_frontend(server, "B").values():
        np.testing.assert_array_equal(np.frombuffer(audio, "<f4"), expected)

    # The single-process server's typed refusals, decided by the engine: exists, over the limit, bad files.
    status, answer = call(server, "POST", "/v1/loras", {"name": "B", "path": str(LORA)})
    assert (status, error_code(answer)) == (409, "persona_exists")
    status, answer = call(server, "POST", "/v1/loras", {"name": "C", "path": str(LORA)})
    assert (status, error_code(answer)) == (409, "persona_limit")  # --max-loras 2

    status, deleted = call(server, "DELETE", "/v1/loras/B")
    assert status == 200 and isinstance(deleted, dict) and deleted["deleted"] is True
    for _ in range(6):
        assert names(server) == ["A"]
        status, answer = call(server, "POST", "/v1/audio/speech", {"input": TEXT, "persona": "B", "seed": 5})
        assert (status, error_code(answer)) == (404, "unknown_persona")
    for _ in range(4):
        with pytest.raises(ServerError) as refused:
            asyncio.run(speak_as(server.ws_url, "B", seed=5))
        assert refused.value.code == "unknown_persona"
    status, answer = call(server, "DELETE", "/v1/loras/B")
    assert (status, error_code(answer)) == (404, "unknown_persona")
    status, answer = call(server, "POST", "/v1/loras", {"name": "C", "path": str(other_lora.parent)})
    assert (status, error_code(answer)) == (400, "invalid_lora")  # the root itself: no lora_config.json
    status, answer = call(server, "POST", "/v1/loras", {"name": "C", "path": str(LORA)})
    assert (status, error_code(answer)) == (400, "invalid_path")  # outside --lora-root
    assert names(server) == ["A"]


def test_owners_travel_to_the_engines(server: ServerProcess, other_lora: Path) -> None:
    """Issue 20.5 under --workers: the frontends forward who asks, and the engines refuse anyone but the owner;
    no key deletes the operator's --lora persona."""
    status, _ = call(server, "POST", "/v1/loras", {"name": "B", "path": str(other_lora)})
    assert status == 201
    for _ in range(4):  # either frontend
        status, answer = call(server, "DELETE", "/v1/loras/B", key=OTHER_KEY)
        assert (status, error_code(answer)) == (403, "forbidden")
        for key in (KEY, OTHER_KEY):
            status, answer = call(server, "DELETE", "/v1/loras/A", key=key)
            assert (status, error_code(answer)) == (403, "forbidden")
        status, answer = call(server, "DELETE", "/loras/A", key=KEY)
        assert status == 403 and isinstance(answer, dict) and "operator" in answer["detail"]
    assert names(server) == ["A", "B"]
    status, _ = call(server, "DELETE", "/v1/loras/B")
    assert status == 200 and names(server) == ["A"]


def test_nanovllm_loras_routes_reach_the_engine(server: ServerProcess, other_lora: Path) -> None:
    status, answer = call(server, "POST", "/loras", {"name": "B", "path": str(other_lora)})
    assert (status, answer) == (200, {"name": "B"})
    for _ in range(6):
        assert call(server, "GET", "/loras") == (200, [{"name": "A"}, {"name": "B"}])
    status, info = call(server, "GET", "/info")
    assert status == 200 and isinstance(info, dict) and info["lora"]["registered_names"] == ["A", "B"]
    assert call(server, "DELETE", "/loras/B") == (200, {"name": "B"})
    status, answer = call(server, "DELETE", "/loras/B")
    assert status == 400 and isinstance(answer, dict) and "B" in answer["detail"]
    assert call(server, "GET", "/loras") == (200, [{"name": "A"}])


def test_a_bad_lora_on_the_command_line_stops_the_server(persona_tts: VoxCPM) -> None:
    command = [sys.executable, "-m", "voxwire.cli.main", "serve", "--model", persona_tts.name, "--workers", "2"]
    command += ["--port", "0", "--lora", f"A={LORA.parent}"]
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, env=environment)
    assert result.returncode == 1, result.stderr
    # The supervisor answers 503 on the port while starting; no frontend ever joined it.
    assert "lora_config.json" in result.stderr and "]: listening on" not in result.stderr


def test_with_devices_a_registered_persona_speaks_on_every_engine(
    persona_tts: VoxCPM, reference: VoxCPM, other_lora: Path
) -> None:
    devices = ("--devices", "cpu,cpu", "--workers", "1", "--max-sessions", "2")
    with persona_server(persona_tts, other_lora.parent, *devices) as server:
        server.wait_ready()
        status, _ = call(server, "POST", "/v1/loras", {"name": "B", "path": str(other_lora)})
        assert status == 201
        before = server.get("/metrics", KEY)

        async def pair() -> list[bytes]:
            # Started together, the two go to different engines (each to the freest one).
            return await asyncio.gather(*(speak_as(server.ws_url, "B", seed=5) for _ in range(2)))

        expected = reference.generate(TEXT, SynthesisParams(seed=5), lora="B")
        for audio in asyncio.run(pair()):
            np.testing.assert_allclose(np.frombuffer(audio, "<f4"), expected, atol=1e-4, rtol=0)
        after = server.get("/metrics", KEY)
        for engine in ("0", "1"):  # each engine stepped the persona's utterance
            name = f'voxwire_engine_step_seconds_count{{engine="{engine}"}}'
            assert metric(after, name) > metric(before, name), (engine, after)
        status, _ = call(server, "DELETE", "/v1/loras/B")
        assert status == 200
        with pytest.raises(ServerError) as refused:
            asyncio.run(speak_as(server.ws_url, "B", seed=5))
        assert refused.value.code == "unknown_persona"


def test_persona_requests_wait_for_a_slot_in_the_engine_process(persona_tts: VoxCPM, reference: VoxCPM) -> None:
    """Issue 20.6 under --workers: three sessions at once, each a different persona, on 2 persona slots (and one key,
    which may hold 1 of them: the default cap, half): each waits its turn for a slot in the engine process and
    speaks whole (was: ``synthesis_failed`` once both slots were held)."""
    loras = ("--lora", f"C={LORA}", "--lora", f"D={LORA}", "--max-loras", "4", "--max-personas", "2")
    with persona_server(persona_tts, LORA.parent, "--workers", "2", "--max-sessions", "4", *loras) as server:
        server.wait_ready()

        async def together() -> list[bytes]:
            return await asyncio.gather(*(speak_as(server.ws_url, name, seed=5) for name in ("A", "C", "D")))

        with server_threads():
            expected = reference.generate(TEXT, SynthesisParams(seed=5), lora="A")  # C and D are A's weights
        for audio in asyncio.run(together()):
            np.testing.assert_allclose(np.frombuffer(audio, "<f4"), expected, atol=1e-4, rtol=0)
