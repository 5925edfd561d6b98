"""LoRA personas over HTTP: ``persona`` on ``/v1/audio/speech``, and ``/v1/loras`` to load, list and remove them
(typed errors for every refusal, auth like voices, a removed persona refused to new requests)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import pytest_asyncio
import torch
from aiohttp import web
from aiohttp.test_utils import TestClient
from safetensors.torch import load_file, save_file

import voxwire
import voxwire.model.lora
from voxwire.errors import InvalidInputError
from voxwire.serving.app import make_app
from voxwire.serving.server_config import ServerConfig
from voxwire.speech_model import VoxCPMSpeech
from voxwire.tiny.checkpoint import make_tiny_checkpoint
from voxwire.tts import VoxCPM

from .conftest import LORA, Serve

Client = Callable[..., Awaitable[TestClient]]


@pytest.fixture(scope="module")
def other_lora(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Persona B: the same layers as ``LORA`` with other weights, in a folder of its own (the ``--lora-root``)."""
    folder = tmp_path_factory.mktemp("loras") / "b"
    shutil.copytree(LORA, folder)
    state = load_file(str(folder / "lora_weights.safetensors"))
    save_file({k: (-0.7 * v).contiguous() for k, v in state.items()}, str(folder / "lora_weights.safetensors"))
    return folder


@pytest_asyncio.fixture
async def http(
    serve: Serve, persona_app: Callable[..., web.Application], aiohttp_client: Client, other_lora: Path
) -> TestClient:
    return await aiohttp_client(await serve(app=persona_app(lora_root=other_lora.parent)))


async def speech(http: TestClient, **fields: object) -> tuple[int, bytes]:
    body = {"input": "Hello there.", "response_format": "pcm", "seed": 5, **fields}
    async with http.post("/v1/audio/speech", json=body) as response:
        return response.status, await response.read()


async def error_code(response_body: bytes) -> str:
    return json.loads(response_body)["error"]["code"]


@pytest.mark.slow
@pytest.mark.asyncio
async def test_speech_with_a_persona_speaks_with_it(http: TestClient) -> None:
    status, adapted = await speech(http, persona="A")
    assert status == 200
    assert await speech(http, persona="A") == (200, adapted)  # the same seed and persona: the same audio
    status, base = await speech(http)
    assert status == 200 and base != adapted


@pytest.mark.asyncio
async def test_speech_with_an_unknown_persona_is_a_typed_404(http: TestClient) -> None:
    status, body = await speech(http, persona="nobody")
    assert status == 404 and await error_code(body) == "unknown_persona"
    status, body = await speech(http, persona=3)
    assert status == 400 and await error_code(body) == "invalid_request"


@pytest.mark.asyncio
async def test_loras_are_listed_added_and_removed(http: TestClient, other_lora: Path) -> None:
    async with http.get("/v1/loras") as response:
        listed = await response.json()
    assert [(p["name"], p["rank"], p["targets"]) for p in listed["data"]] == [
        ("A", 8, {"lm": True, "dit": True, "projections": True})
    ]

    async with http.post("/v1/loras", json={"name": "B", "path": str(other_lora)}) as response:
        assert response.status == 201
        added = await response.json()
    assert (added["name"], added["path"], added["in_use"]) == ("B", "b", 0)  # relative to --lora-root
    status, with_b = await speech(http, persona="B")
    status_a, with_a = await speech(http, persona="A")
    assert status == status_a == 200 and with_a != with_b

    async with http.get("/v1/loras") as response:
        assert [p["name"] for p in (await response.json())["data"]] == ["A", "B"]
    async with http.delete("/v1/loras/B") as response:
        assert response.status == 200 and (await response.json())["deleted"] is True
    status, body = await speech(http, persona="B")
    assert status == 404 and await error_code(body) == "unknown_persona"
    async with http.delete("/v1/loras/B") as response:
        assert response.status == 404 and (await response.json())["error"]["code"] == "unknown_persona"


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"name": "A", "path": "b"}, 409, "persona_exists"),
        ({"name": "bad name!", "path": "b"}, 400, "invalid_name"),
        ({"name": "C", "path": "/no/such/folder"}, 400, "invalid_path"),
        ({"name": "C", "path": "no-such-folder"}, 400, "invalid_path"),
        ({"name": "C", "path": "b/lora_config.json"}, 400, "invalid_path"),
        ({"name": "C", "path": "."}, 400, "invalid_lora"),  # the root itself: no lora_config.json
        ({"name": "C"}, 400, "invalid_request"),
        ({"name": "C", "path": "b", "rank": 4}, 400, "unknown_field"),
        (["C"], 400, "invalid_request"),
    ],
)
@pytest.mark.asyncio
async def test_bad_lora_uploads_get_typed_errors(http: TestClient, body: object, status: int, code: str) -> None:
    async with http.post("/v1/loras", json=body) as response:
        assert response.status == status
        assert (await response.json())["error"]["code"] == code
    async with http.get("/v1/loras") as response:
        assert [p["name"] for p in (await response.json())["data"]] == ["A"]


@pytest.mark.asyncio
async def test_limits_on_loras(
    serve: Serve, persona_app: Callable[..., web.Application], aiohttp_client: Client, other_lora: Path
) -> None:
    http = await aiohttp_client(await serve(app=persona_app(max_loras=2, lora_root=other_lora.parent)))
    async with http.post("/v1/loras", json={"name": "B", "path": str(other_lora)}) as response:
        assert response.status == 201
    async with http.post("/v1/loras", json={"name": "C", "path": str(other_lora)}) as response:
        assert (response.status, (await response.json())["error"]["code"]) == (409, "persona_limit")  # A and B
    async with http.delete("/v1/loras/B") as response:
        assert response.status == 200
    async with http.post("/v1/loras", json={"name": "C", "path": str(LORA)}) as response:
        assert (response.status, (await response.json())["error"]["code"]) == (400, "invalid_path")  # outside root
    async with http.post("/v1/loras", json={"name": "C", "path": str(other_lora)}) as response:
        assert response.status == 201


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_rank_above_the_limit_is_refused_before_its_weights_are_read(
    serve: Serve, aiohttp_client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 20.9: the rank was checked once every weight was in memory. Now it is read from the config and the
    safetensors header first; the weight loader is never called (``r`` in the config may also understate it)."""
    # A model of its own: the persona capacity is fixed when a model first gets personas.
    tts = voxwire.load_model(make_tiny_checkpoint(tmp_path / "v2", "voxcpm2", seed=0), device="cpu")
    root = tmp_path / "loras"
    shutil.copytree(LORA, root / "a")
    shutil.copytree(LORA, root / "understated")  # rank 8 weights, "r": 2 in its config
    config_file = root / "understated" / "lora_config.json"
    config_file.write_text(config_file.read_text().replace('"r": 8', '"r": 2'))
    config = ServerConfig.of(port=0, max_sessions=2, drain_timeout_s=5.0, max_lora_rank=4, lora_root=root)
    http = await aiohttp_client(await serve(app=make_app(config, model=VoxCPMSpeech(tts))))

    def no_weights(*args: object, **kwargs: object) -> object:
        raise AssertionError("the weights were read")

    monkeypatch.setattr(voxwire.model.lora, "load_file", no_weights)
    for folder, said in (("a", "rank 8 (r=8 in lora_config.json)"), ("understated", "rank 8 (base_lm.")):
        async with http.post("/v1/loras", json={"name": "A", "path": str(root / folder)}) as response:
            answer = await response.json()
        assert (response.status, answer["error"]["code"]) == (400, "lora_too_large"), answer
        assert said in answer["error"]["message"] and "max_rank=4" in answer["error"]["message"]


@pytest.mark.asyncio
async def test_re_adding_a_name_requests_still_speak_with_is_409(
    http: TestClient, persona_tts: VoxCPM, other_lora: Path
) -> None:
    """Issue 20.9: a persona deleted while a request holds it is still resident; adding its name again answered
    ``lora_too_large``. It is ``persona_exists`` (409) until the request ends, then it loads."""
    body = {"name": "B", "path": str(other_lora)}
    async with http.post("/v1/loras", json=body) as response:
        assert response.status == 201
    bank = persona_tts.personas
    assert bank is not None
    bank.acquire("B")  # a request speaking with B
    try:
        async with http.delete("/v1/loras/B") as response:
            assert response.status == 200
        async with http.post("/v1/loras", json=body) as response:
            answer = await response.json()
        assert (response.status, answer["error"]["code"]) == (409, "persona_exists"), answer
    finally:
        bank.release("B")
    async with http.post("/v1/loras", json=body) as response:
        assert response.status == 201


@pytest.mark.asyncio
async def test_without_lora_or_lora_root_no_layer_is_adapted_and_adding_is_refused(
    serve: Serve, aiohttp_client: Client, tmp_path: Path
) -> None:
    """Personas are reserved at start-up (captured graphs read their slot buffers): a server started without them
    adapts no layer, so its steps cost nothing extra, and says how to get personas."""
    tts = voxwire.load_model(make_tiny_checkpoint(tmp_path / "v2", "voxcpm2", seed=0), device="cpu")
    config = ServerConfig.of(port=0, max_sessions=2, drain_timeout_s=5.0)
    http = await aiohttp_client(await serve(app=make_app(config, model=VoxCPMSpeech(tts))))
    async with http.post("/v1/loras", json={"name": "A", "path": str(LORA)}) as response:
        answer = await response.json()
    assert (response.status, answer["error"]["code"]) == (400, "personas_unavailable")
    assert "--lora-root" in answer["error"]["message"]
    async with http.get("/v1/loras") as response:
        assert (response.status, (await response.json())["data"]) == (200, [])
    assert tts.personas is None


def strict_json(text: str) -> object:
    """JSON as a strict parser reads it: a bare NaN or Infinity is an error."""

    def refuse(constant: str) -> object:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("poison", ["weights", "alpha"])
@pytest.mark.asyncio
async def test_a_nan_lora_is_refused_and_the_listing_stays_json(
    http: TestClient, other_lora: Path, poison: str
) -> None:
    """Issue 20.1: NaN weights loaded with 201 (and silenced everyone), and ``"alpha": NaN`` was listed as a bare
    NaN, which strict JSON parsers refuse."""
    folder = other_lora.parent / f"nan-{poison}"
    shutil.copytree(LORA, folder, dirs_exist_ok=True)
    if poison == "weights":
        state = load_file(str(folder / "lora_weights.safetensors"))
        save_file(
            {k: torch.full_like(v, float("nan")) for k, v in state.items()}, str(folder / "lora_weights.safetensors")
        )
    else:
        config = (folder / "lora_config.json").read_text()
        (folder / "lora_config.json").write_text(config.replace('"alpha": 16', '"alpha": NaN'))
    async with http.post("/v1/loras", json={"name": "nan", "path": str(folder)}) as response:
        answer = strict_json(await response.text())
    assert response.status == 400 and answer["error"]["code"] == "invalid_lora"  # type: ignore[index]
    async with http.get("/v1/loras") as response:
        listed = strict_json(await response.text())
    assert [p["name"] for p in listed["data"]] == ["A"]  # type: ignore[index]


@pytest.mark.asyncio
async def test_loras_need_an_api_key_like_voices(
    serve: Serve, persona_app: Callable[..., web.Application], aiohttp_client: Client
) -> None:
    http = await aiohttp_client(await serve(app=persona_app(api_keys=("secret",))))
    for method, path in (("GET", "/v1/loras"), ("POST", "/v1/loras"), ("DELETE", "/v1/loras/A")):
        async with http.request(method, path, json={"name": "C", "path": str(LORA)}) as response:
            assert response.status == 401, (method, path)
    async with http.get("/v1/loras", headers={"Authorization": "Bearer secret"}) as response:
        assert response.status == 200


def test_a_bad_lora_at_startup_stops_the_server(persona_app: Callable[..., web.Application]) -> None:
    from voxwire.serving.speech.persona_names import PersonaLoadError

    with pytest.raises(PersonaLoadError, match=r"lora_config\.json"):
        persona_app(loras=(("A", LORA.parent),))


@pytest.mark.asyncio
async def test_a_server_without_personas_says_so(serve: Serve, aiohttp_client: Client) -> None:
    from voxwire.serving.speech.load import load_speech_model

    config = ServerConfig.of(port=0, model="sim", max_sessions=2, drain_timeout_s=5.0)
    with pytest.raises(InvalidInputError, match="--lora needs a checkpoint"):
        make_app(config.with_settings(loras=(("A", LORA),)))
    http = await aiohttp_client(await serve(app=make_app(config, model=load_speech_model(config))))
    async with http.get("/v1/loras") as response:
        assert (response.status, (await response.json())["error"]["code"]) == (400, "personas_unavailable")
    status, body = await speech(http, persona="A")
    assert status == 404 and await error_code(body) == "unknown_persona"
    async with http.post("/generate", json={"target_text": "Hi.", "lora_name": "A"}) as response:
        refusal = await response.json()
        assert response.status == 400 and refusal["detail"] == "LoRA 'A' is not registered"
        assert refusal == {"detail": refusal["detail"], "request_id": response.headers["X-Request-Id"]}
