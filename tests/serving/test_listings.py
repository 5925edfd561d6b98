"""What a client discovers: ``GET /v1/models`` (OpenAI's shape, read by the OpenAI SDK), ``GET /v1/audio/voices``
(a voice picker's list) and ``GET /v1/voices`` (built-in voices first, marked, then the saved ones); every voice
listed can be spoken in; ``default`` is the model's own voice, and an OpenAI name on VoxCPM2 (the tiny model) is the
voice its listed description designs."""

from __future__ import annotations

import openai
import pytest
from aiohttp.test_utils import TestClient
from tests.serving.helpers import clip, upload

from voxwire.serving.runtime.keys import SPEAKER_KEY
from voxwire.serving.speech.voice_design import OPENAI_VOICE_DESIGNS

pytestmark = pytest.mark.asyncio

OPENAI_NAMES = ["alloy", "ash", "ballad", "cedar", "coral", "echo", "fable", "marin", "nova", "onyx", "sage", "shimmer",
                "verse"]  # fmt: skip
BUILTIN = ["default", *OPENAI_NAMES]


async def speech(client: TestClient, **fields: object) -> bytes:
    body = {"model": "tts-1", "input": "Which voice is this?", "response_format": "pcm", "seed": 3, **fields}
    async with client.post("/v1/audio/speech", json=body) as response:
        assert response.status == 200, await response.text()
        return await response.read()


async def test_the_openai_sdk_lists_and_retrieves_the_served_model(client: TestClient) -> None:
    served = client.server.app[SPEAKER_KEY].info.name
    async with client.get("/v1/models") as response:
        listing = await response.json()
    assert listing["object"] == "list" and [model["id"] for model in listing["data"]] == [served]
    model = listing["data"][0]
    assert model["object"] == "model" and model["owned_by"] == "voxwire" and isinstance(model["created"], int)

    sdk = openai.AsyncOpenAI(base_url=str(client.make_url("/v1")), api_key="unused", max_retries=0)
    assert [model.id async for model in sdk.models.list()] == [served]
    assert (await sdk.models.retrieve(served)).id == served
    with pytest.raises(openai.NotFoundError) as missing:
        await sdk.models.retrieve("tts-1")
    assert missing.value.code == "not_found"
    await sdk.close()


def builtin_picker() -> list[dict]:
    """``GET /v1/audio/voices``'s built-in voices on a VoxCPM2 model: ``default`` and the designed OpenAI names."""
    return [{"id": "default", "name": "default", "builtin": True, "description": None}] + [
        {"id": name, "name": name, "builtin": True, "description": OPENAI_VOICE_DESIGNS[name]} for name in OPENAI_NAMES
    ]


async def test_a_fresh_server_lists_the_builtin_voices(client: TestClient) -> None:
    async with client.get("/v1/audio/voices") as response:
        assert response.status == 200
        picker = (await response.json())["voices"]
    assert picker == builtin_picker()
    async with client.get("/v1/voices") as response:
        listed = (await response.json())["data"]
    served = client.server.app[SPEAKER_KEY].info.name
    assert [(voice["id"], voice["description"]) for voice in listed] == [(v["id"], v["description"]) for v in picker]
    assert all(voice["builtin"] is True and voice["object"] == "voice" and voice["model"] == served for voice in listed)
    # A saved voice's fields, of the same types (a client formatting durations reads both alike).
    assert all((voice["duration_s"], voice["created_at"], voice["transcript"]) == (0.0, 0, None) for voice in listed)


async def test_each_builtin_voice_speaks_as_listed(client: TestClient) -> None:
    """``default`` is the model's own voice; a designed name is its listed description, as ``instructions``."""
    async with client.get("/v1/audio/voices") as response:
        described = {voice["id"]: voice["description"] for voice in (await response.json())["voices"]}
    assert await speech(client, voice="default") == await speech(client)
    for name in ("alloy", "verse"):
        as_instructions = await speech(client, voice="default", instructions=described[name])
        assert await speech(client, voice=name) == as_instructions != await speech(client)


@pytest.mark.slow
async def test_saved_voices_follow_the_builtin_ones_and_are_spoken_in(client: TestClient) -> None:
    status, saved = await upload(client, clip(), transcript="What I say in the clip.", name="Mine")
    assert status == 201
    async with client.get("/v1/audio/voices") as response:
        picker = (await response.json())["voices"]
    assert picker[: len(BUILTIN)] == builtin_picker()
    assert picker[len(BUILTIN) :] == [{"id": saved["id"], "name": "Mine", "builtin": False, "description": None}]
    async with client.get("/v1/voices") as response:
        listed = (await response.json())["data"]
    assert listed[-1] == {**saved, "builtin": False, "description": None}
    for voice in picker:
        assert len(await speech(client, voice=voice["id"])) > 0
    async with client.delete(f"/v1/voices/{saved['id']}") as response:
        assert response.status == 200
    async with client.get("/v1/audio/voices") as response:
        assert [voice["id"] for voice in (await response.json())["voices"]] == BUILTIN


async def test_the_listings_need_the_key_when_one_is_set(serve, aiohttp_client) -> None:
    client = await aiohttp_client(await serve(api_keys=("k",)))
    for path in ("/v1/models", "/v1/audio/voices", "/v1/voices"):
        async with client.get(path) as response:
            assert response.status == 401
        async with client.get(path, headers={"Authorization": "Bearer k"}) as response:
            assert response.status == 200


@pytest.mark.parametrize("name", ["alloy", "default", "Coral"])
async def test_deleting_a_built_in_voice_is_forbidden_and_it_stays_listed(client: TestClient, name: str) -> None:
    async with client.delete(f"/v1/voices/{name}") as response:
        assert response.status == 403
        error = (await response.json())["error"]
    assert error["code"] == "forbidden" and "built-in" in error["message"]
    async with client.get("/v1/voices") as response:
        assert name.lower() in [voice["id"] for voice in (await response.json())["data"]]
    assert await speech(client, voice=name)
