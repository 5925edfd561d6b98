"""Issue 20, item 6: full persona slots make a request wait (or answer 503 ``busy``), never a non-retryable 422.

Probe N6: with ``--max-personas 4``, six concurrent speech requests, each a different persona: 4 returned 200 and 2
failed at once with 422 ``synthesis_failed`` ("all 4 persona slots are in use by running requests"). Any client
holding 4 long utterances locked every other persona user out. Now a request waits in the engine's queue for a
persona slot, one key (or connection) holds at most ``--persona-slots-per-client`` of them, and a request that
waits longer than ``--max-persona-wait-s`` (or finds the queue full) gets 503 ``busy`` with ``Retry-After``.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from safetensors.torch import load_file, save_file

from voxwire.chunk import Chunk
from voxwire.params import SynthesisParams
from voxwire.serving.edge.auth import key_owner
from voxwire.serving.runtime.keys import ENGINES_KEY, SPEAKER_KEY
from voxwire.serving.speech.persona_names import client_owner
from voxwire.serving.speech.service import SpeechJob, UtteranceOptions

from .conftest import LORA, Serve

pytestmark = pytest.mark.asyncio

Client = Callable[..., Awaitable[TestClient]]
TEXT = "Hello there."
LONG = "One long utterance. " * 4
"""About 370 steps (the text's bound, within the tiny model's 512 positions): seconds of holding a persona."""
KEY_A, KEY_B = "key-of-a", "key-of-b"
SCALES = (1.0, -0.7, 0.5, 1.3, -0.4, 0.8)
"""Persona ``P<i>``: the reference adapter's weights times ``SCALES[i]`` (six different voices)."""


@pytest.fixture(scope="module")
def personas(tmp_path_factory: pytest.TempPathFactory) -> tuple[tuple[str, Path], ...]:
    """``--lora`` of the six personas ``P0``-``P5``."""
    state = load_file(str(LORA / "lora_weights.safetensors"))
    loras = []
    for index, scale in enumerate(SCALES):
        folder = tmp_path_factory.mktemp("personas") / f"p{index}"
        shutil.copytree(LORA, folder)
        save_file({k: (scale * v).contiguous() for k, v in state.items()}, str(folder / "lora_weights.safetensors"))
        loras.append((f"P{index}", folder))
    return tuple(loras)


@pytest.fixture
def app_with(
    serve: Serve, persona_app: Callable[..., web.Application], aiohttp_client: Client, personas: Any
) -> Callable[..., Awaitable[TestClient]]:
    """``await app_with(**overrides)``: a client on an app with personas P0-P5, 4 persona slots, 8 sessions."""

    async def start(**overrides: Any) -> TestClient:
        settings = {"loras": personas, "max_personas": 4, "max_sessions": 8, **overrides}
        return await aiohttp_client(await serve(app=persona_app(**settings)))

    return start


async def speak(http: TestClient, persona: str | None, key: str | None = None) -> tuple[int, bytes, Any]:
    """``POST /v1/audio/speech``: the status, the body and the headers."""
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    body = {"input": TEXT, "response_format": "pcm", "seed": 5, **({"persona": persona} if persona else {})}
    async with http.post("/v1/audio/speech", json=body, headers=headers) as response:
        return response.status, await response.read(), response.headers


@contextlib.asynccontextmanager
async def holding(http: TestClient, personas: list[str], owners: list[str]) -> AsyncIterator[list[asyncio.Task[Chunk]]]:
    """Long utterances (a long text, no early stop) of these personas, one per owner (``client_owner`` names),
    submitted in order; yields each one's first-chunk task (done once it runs). Aborted on the way out."""
    service = http.server.app[SPEAKER_KEY]
    params = SynthesisParams(min_len=10_000, max_len=10_000)
    streams: list[AsyncGenerator[Chunk, None]] = []
    firsts: list[asyncio.Task[Chunk]] = []
    for index, (persona, owner) in enumerate(zip(personas, owners, strict=True)):
        job = SpeechJob(f"hold-{index}", LONG, params, options=UtteranceOptions(persona, owner=owner))
        streams.append(service.speak(job))
        firsts.append(asyncio.ensure_future(anext(streams[-1])))
    try:
        yield firsts
    finally:
        for first in firsts:
            first.cancel()
        await asyncio.gather(*firsts, return_exceptions=True)  # a generator is closed only once its step is done
        for stream in streams:
            await stream.aclose()


async def idle(http: TestClient) -> None:
    """Wait until the engine's latest step left nothing running or waiting (the holds' aborts are applied)."""
    service = http.server.app[ENGINES_KEY]
    while service.engine.stats().running or service.engine.stats().waiting:
        await asyncio.sleep(0.02)


async def running(firsts: list[asyncio.Task[Chunk]], count: int) -> None:
    """Wait until the first ``count`` holds run."""
    await asyncio.wait_for(asyncio.gather(*firsts[:count]), 60)


@pytest.mark.slow
async def test_six_personas_on_four_slots_all_speak_their_solo_audio(
    app_with: Callable[..., Awaitable[TestClient]],
) -> None:
    """Probe N6 reproduced: six concurrent requests, each a different persona, on 4 persona slots: all six are
    200 (two wait for slots) and each is byte for byte its solo audio (batch-invariant numerics)."""
    http = await app_with(batch_invariant=True)
    names = [f"P{index}" for index in range(6)]
    alone = {}
    for name in names:
        status, audio, _ = await speak(http, name)
        assert status == 200 and audio, name
        alone[name] = audio
    assert len(set(alone.values())) == 6  # six different voices
    together = await asyncio.gather(*(speak(http, name) for name in names))
    for name, (status, audio, _) in zip(names, together, strict=True):
        assert status == 200, (name, audio[:300])
        assert audio == alone[name], name


async def test_a_request_waiting_too_long_for_a_persona_slot_is_503_busy(
    app_with: Callable[..., Awaitable[TestClient]],
) -> None:
    """Every persona slot held: a request for a fifth persona waits ``--max-persona-wait-s``, then 503 ``busy``
    with ``Retry-After`` (was: 422 ``synthesis_failed`` at once)."""
    http = await app_with(max_persona_wait_s=0.3, max_sessions=5)
    async with holding(http, ["P0", "P1", "P2", "P3"], [f"client-{i}" for i in range(4)]) as firsts:
        await running(firsts, 4)
        started = asyncio.get_running_loop().time()
        status, body, headers = await speak(http, "P4")
        assert asyncio.get_running_loop().time() - started >= 0.3
        assert (status, headers.get("Retry-After")) == (503, "1"), body
        assert b'"busy"' in body and b"persona" in body
    await asyncio.wait_for(idle(http), 30)
    assert (await speak(http, "P4"))[0] == 200


async def test_a_full_queue_of_persona_requests_is_503_busy_at_once(
    app_with: Callable[..., Awaitable[TestClient]],
) -> None:
    """Every persona slot held and the queue full of requests waiting for one (a session slot is free): a new
    persona request is refused 503 ``busy`` with ``Retry-After`` at once."""
    http = await app_with(max_sessions=5, max_waiting=1)
    holds = ["P0", "P1", "P2", "P3", "P4", "P4"]
    async with holding(http, holds, [f"client-{i}" for i in range(6)]) as firsts:
        await running(firsts, 4)
        started = asyncio.get_running_loop().time()
        status, body, headers = await speak(http, "P5")
        assert asyncio.get_running_loop().time() - started < 5
        assert (status, headers.get("Retry-After")) == (503, "1") and b'"busy"' in body
        assert not firsts[4].done() and not firsts[5].done()  # they still wait
    await asyncio.wait_for(idle(http), 30)
    assert (await speak(http, "P5"))[0] == 200


async def test_one_key_holding_persona_slots_cannot_lock_out_another_key(
    app_with: Callable[..., Awaitable[TestClient]],
) -> None:
    """Key A asks for four long persona utterances at once: it gets 2 slots (the default cap, half of 4), its
    others wait. Key B's persona request gets through (was: 422, every slot held by A)."""
    http = await app_with(api_keys=(KEY_A, KEY_B))
    owner_a = client_owner(key_owner(KEY_A), None)  # what the server names a request with key A
    async with holding(http, ["P0", "P1", "P2", "P3"], [owner_a] * 4) as firsts:
        await running(firsts, 2)
        status, audio, _ = await speak(http, "P4", KEY_B)
        assert status == 200 and audio
        assert not firsts[2].done() and not firsts[3].done()  # A's others still wait


async def test_a_waiting_persona_request_delays_no_other_request(
    app_with: Callable[..., Awaitable[TestClient]],
) -> None:
    """With every persona slot held, a request for another persona waits; requests without a persona, or with a
    persona that is held already, still start at once; the waiting one speaks once a slot frees."""
    http = await app_with()
    alone = (await speak(http, "P4"))[1]
    async with holding(http, ["P0", "P1", "P2", "P3"], [f"client-{i}" for i in range(4)]) as firsts:
        await running(firsts, 4)
        waiting = asyncio.ensure_future(speak(http, "P4"))
        for persona in (None, "P0"):
            status, audio, _ = await speak(http, persona)
            assert status == 200 and audio, persona
        assert not waiting.done()
    status, audio, _ = await asyncio.wait_for(waiting, 60)
    assert status == 200 and audio == alone
