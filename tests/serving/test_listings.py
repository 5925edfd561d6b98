"""What a client discovers: ``GET /v1/models`` (OpenAI's shape, read by the OpenAI SDK), ``GET /v1/audio/voices``
(a voice picker's list) and ``GET /v1/voices`` (built-in voices first, marked, then the saved ones); every voice
listed can be spoken in, and a built-in one is the model's own voice."""

from __future__ import annotations

import openai
import pytest
from aiohttp.test_utils import TestClient

from voxwire.serving.keys import SERVICE_KEY

from .test_voices import clip, upload

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
    served = client.server.app[SERVICE_KEY].info.name
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


async def test_a_fresh_server_lists_the_builtin_voices(client: TestClient) -> None:
    async with client.get("/v1/audio/voices") as response:
        assert response.status == 200
        picker = (await response.json())["voices"]
    assert picker == [{"id": name, "name": name, "builtin": True} for name in BUILTIN]
    async with client.get("/v1/voices") as response:
        listed = (await response.json())["data"]
    served = client.server.app[SERVICE_KEY].info.name
    assert [voice["id"] for voice in listed] == BUILTIN
    assert all(voice["builtin"] is True and voice["object"] == "voice" and voice["model"] == served for voice in listed)
    # A saved voice's fields, of the same types (a client formatting durations reads both alike).
    assert all((voice["duration_s"], voice["created_at"], voice["transcript"]) == (0.0, 0, None) for voice in listed)


async def test_every_builtin_voice_is_the_models_own_voice(client: TestClient) -> None:
    own = await speech(client)
    for name in ("default", "alloy", "verse"):
        assert await speech(client, voice=name) == own


async def test_saved_voices_follow_the_builtin_ones_and_are_spoken_in(client: TestClient) -> None:
    status, saved = await upload(client, clip(), transcript="What I say in the clip.", name="Mine")
    assert status == 201
    async with client.get("/v1/audio/voices") as response:
        picker = (await response.json())["voices"]
    assert picker[: len(BUILTIN)] == [{"id": name, "name": name, "builtin": True} for name in BUILTIN]
    assert picker[len(BUILTIN) :] == [{"id": saved["id"], "name": "Mine", "builtin": False}]
    async with client.get("/v1/voices") as response:
        listed = (await response.json())["data"]
    assert listed[-1] == {**saved, "builtin": False}
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
