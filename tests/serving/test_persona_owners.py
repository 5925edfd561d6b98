"""Issue 20, item 5: personas are owned like voices, are added only from ``--lora-root``, and nothing a client reads
about them (errors, listings, ``/info``, voice listings) carries a server path or a file's contents.

Any key could delete the operator's ``--lora`` personas; with no ``--lora-root`` anyone could load any readable
folder; a checkpoint file linked out of the root loaded; and refusals named the resolved folder (the server's
home, ``/proc/<pid>``) and the keys of ``lora_config.json``."""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from tests.serving.helpers import clip, upload

from voxwire.serving.runtime.keys import VOICES_KEY
from voxwire.serving.speech.voice_store import VoiceInfo
from voxwire.tts import VoxCPM

from .conftest import LORA, Serve

pytestmark = pytest.mark.asyncio

Client = Callable[..., Awaitable[TestClient]]
KEY_A, KEY_B = "key-of-a", "key-of-b"
TEXT = "Hello there."


@pytest.fixture
def lora_root(tmp_path: Path) -> Path:
    """The ``--lora-root``: ``b`` (a good checkpoint), and next to it, outside, another good one."""
    root = tmp_path / "loras"
    shutil.copytree(LORA, root / "b")
    shutil.copytree(LORA, tmp_path / "outside")
    return root


async def call(http: TestClient, method: str, path: str, key: str | None = None, **kwargs: Any) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    async with http.request(method, path, headers=headers, **kwargs) as response:
        return response.status, await response.json()


async def speak(http: TestClient, persona: str, key: str | None = None) -> tuple[int, bytes]:
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    body = {"input": TEXT, "response_format": "pcm", "seed": 5, "persona": persona}
    async with http.post("/v1/audio/speech", json=body, headers=headers) as response:
        return response.status, await response.read()


async def names(http: TestClient, key: str | None = None) -> list[str]:
    status, listed = await call(http, "GET", "/v1/loras", key)
    assert status == 200
    return [persona["name"] for persona in listed["data"]]


@pytest.fixture
def app_with(
    serve: Serve, persona_app: Callable[..., web.Application], aiohttp_client: Client, lora_root: Path
) -> Callable[..., Awaitable[TestClient]]:
    """``await app_with(**overrides)``: a client on the persona app (``A`` from ``--lora``) with ``lora_root``."""

    async def start(**overrides: Any) -> TestClient:
        return await aiohttp_client(await serve(app=persona_app(**{"lora_root": lora_root, **overrides})))

    return start


@pytest.mark.parametrize("keys", [(KEY_A, KEY_B), ()], ids=["with-keys", "without-keys"])
async def test_no_client_deletes_an_operator_persona_and_it_keeps_speaking(
    app_with: Callable[..., Awaitable[TestClient]], keys: tuple[str, ...]
) -> None:
    http = await app_with(api_keys=keys)
    key = keys[0] if keys else None
    status, before = await speak(http, "A", key)
    assert status == 200
    for requester in keys or (None,):
        status, answer = await call(http, "DELETE", "/v1/loras/A", requester)
        assert (status, answer["error"]["code"]) == (403, "forbidden"), requester
        assert "operator" in answer["error"]["message"]
        status, answer = await call(http, "DELETE", "/loras/A", requester)  # Nano-vLLM-VoxCPM's route
        assert status == 403 and "operator" in answer["detail"]
    assert await names(http, key) == ["A"]
    assert await speak(http, "A", key) == (200, before)


async def test_only_the_key_that_added_a_persona_deletes_it(
    app_with: Callable[..., Awaitable[TestClient]], lora_root: Path
) -> None:
    http = await app_with(api_keys=(KEY_A, KEY_B))
    b = str(lora_root / "b")
    status, _ = await call(http, "POST", "/v1/loras", KEY_A, json={"name": "B", "path": b})
    assert status == 201
    status, answer = await call(http, "DELETE", "/v1/loras/B", KEY_B)
    assert (status, answer["error"]["code"]) == (403, "forbidden") and "another API key" in answer["error"]["message"]
    status, answer = await call(http, "DELETE", "/loras/B", KEY_B)
    assert status == 403 and "another API key" in answer["detail"]
    assert await names(http, KEY_B) == ["A", "B"]
    assert (await speak(http, "B", KEY_B))[0] == 200  # anyone may speak with it

    status, answer = await call(http, "POST", "/loras", KEY_B, json={"name": "C", "path": b})
    assert (status, answer) == (200, {"name": "C"})
    assert (await call(http, "DELETE", "/v1/loras/C", KEY_A))[0] == 403
    assert await call(http, "DELETE", "/loras/C", KEY_B) == (200, {"name": "C"})
    status, answer = await call(http, "DELETE", "/v1/loras/B", KEY_A)
    assert status == 200 and answer["deleted"] is True
    assert await names(http, KEY_A) == ["A"]


async def test_without_keys_a_persona_added_by_anyone_is_deleted_by_anyone(
    app_with: Callable[..., Awaitable[TestClient]], lora_root: Path
) -> None:
    http = await app_with()
    assert (await call(http, "POST", "/v1/loras", json={"name": "B", "path": str(lora_root / "b")}))[0] == 201
    assert (await call(http, "DELETE", "/v1/loras/B"))[0] == 200


async def test_adding_a_persona_needs_a_lora_root(
    serve: Serve, persona_app: Callable[..., web.Application], aiohttp_client: Client, lora_root: Path
) -> None:
    """Started with ``--lora`` and no ``--lora-root`` (or no key), the server loaded any folder it could read."""
    http = await aiohttp_client(await serve(app=persona_app()))
    status, answer = await call(http, "POST", "/v1/loras", json={"name": "B", "path": str(lora_root / "b")})
    assert (status, answer["error"]["code"]) == (400, "personas_unavailable")
    assert "--lora-root" in answer["error"]["message"]
    status, answer = await call(http, "POST", "/loras", json={"name": "B", "path": str(lora_root / "b")})
    assert status == 400 and "--lora-root" in answer["detail"]
    assert await names(http) == ["A"]


def link_out(root: Path, what: str) -> str:
    """A folder in ``root`` that is, or whose ``what`` file is, a symbolic link to the good checkpoint outside."""
    outside = root.parent / "outside"
    if what == "folder":
        (root / "linked").symlink_to(outside, target_is_directory=True)
        return "linked"
    folder = root / f"linked-{what}"
    shutil.copytree(LORA, folder)
    (folder / what).unlink()
    (folder / what).symlink_to(outside / what)
    return folder.name


@pytest.mark.parametrize("what", ["folder", "lora_config.json", "lora_weights.safetensors"])
async def test_a_link_out_of_the_root_is_refused(
    app_with: Callable[..., Awaitable[TestClient]], lora_root: Path, what: str
) -> None:
    http = await app_with()
    path = link_out(lora_root, what)
    for body in ({"name": "B", "path": str(lora_root / path)}, {"name": "B", "path": path}):
        status, answer = await call(http, "POST", "/v1/loras", json=body)
        assert (status, answer["error"]["code"]) == (400, "invalid_path"), body
        assert str(lora_root.parent / "outside") not in answer["error"]["message"]  # only the path it sent
    assert await names(http) == ["A"]


def bad_folders(root: Path) -> dict[str, str]:
    """Checkpoint folders in ``root`` that cannot load, by what is wrong; every file holds the word SECRET."""
    folders: dict[str, str] = {}
    (root / "empty").mkdir()
    folders["empty"] = "lora_config.json is missing"
    for name, config in (
        ("unknown-keys", {"lora_config": {"r": 8, "SECRET_FIELD": "x", "alpha": "SECRET_VALUE"}}),
        ("not-json", None),
        ("no-section", {"SECRET_FIELD": 1}),
    ):
        shutil.copytree(LORA, root / name)
        text = "{SECRET not json" if config is None else json.dumps(config)
        (root / name / "lora_config.json").write_text(text)
        folders[name] = "lora_config.json"
    shutil.copytree(LORA, root / "bad-weights")
    (root / "bad-weights" / "lora_weights.safetensors").write_bytes(b"SECRET" * 100)
    folders["bad-weights"] = "lora_weights.safetensors"
    shutil.copytree(LORA, root / "no-weights")
    (root / "no-weights" / "lora_weights.safetensors").unlink()
    (root / "no-weights" / "lora_weights.ckpt").write_bytes(b"SECRET" * 100)
    folders["no-weights"] = "lora_weights.ckpt"
    return folders


async def test_refusals_name_no_server_path_and_no_file_contents(
    app_with: Callable[..., Awaitable[TestClient]], lora_root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="voxwire.serving")
    http = await app_with()
    secrets = [str(lora_root.parent), str(lora_root.resolve().parent), "SECRET"]
    for folder, named in bad_folders(lora_root).items():
        for path in (str(lora_root / folder), folder):
            status, answer = await call(http, "POST", "/v1/loras", json={"name": "B", "path": path})
            message = answer["error"]["message"]
            assert (status, answer["error"]["code"]) == (400, "invalid_lora"), (folder, message)
            assert named in message and not any(secret in message for secret in secrets), message
            status, answer = await call(http, "POST", "/loras", json={"name": "B", "path": path})
            assert status == 400 and not any(secret in answer["detail"] for secret in secrets), answer
    assert str(lora_root / "empty") in caplog.text  # the operator's log keeps the detail
    for path in ("/proc/self", "~", "../outside"):  # outside the root: the home, the PID, a sibling
        status, answer = await call(http, "POST", "/v1/loras", json={"name": "B", "path": path})
        message = answer["error"]["message"]
        assert (status, answer["error"]["code"]) == (400, "invalid_path"), message
        assert f"/proc/{os.getpid()}" not in message and not any(secret in message for secret in secrets), message
        assert Path.home() == Path("/") or str(Path.home()) not in message
    assert await names(http) == ["A"]


async def test_listings_and_info_name_no_server_path(
    app_with: Callable[..., Awaitable[TestClient]], lora_root: Path, persona_tts: VoxCPM
) -> None:
    http = await app_with()
    shutil.copytree(LORA, lora_root / "team" / "calm")
    assert (await call(http, "POST", "/v1/loras", json={"name": "B", "path": str(lora_root / "b")}))[0] == 201
    assert (await call(http, "POST", "/v1/loras", json={"name": "C", "path": str(lora_root / "team/calm")}))[0] == 201
    status, listed = await call(http, "GET", "/v1/loras")
    assert status == 200
    # Relative to the root; the operator's --lora persona by its folder's name.
    assert [(p["name"], p["path"]) for p in listed["data"]] == [("A", LORA.name), ("B", "b"), ("C", "team/calm")]

    model_folder = Path(persona_tts.name)
    assert model_folder.is_absolute()  # the --model the tests serve: an absolute path in a temporary folder
    status, info = await call(http, "GET", "/info")
    assert status == 200 and info["model"]["model_path"] == model_folder.name
    status, voice = await upload(http, clip(0.5))
    assert status == 201 and voice["model"] == model_folder.name
    for text in (json.dumps(listed), json.dumps(info), json.dumps(voice)):
        assert str(lora_root) not in text and str(LORA.parent) not in text and str(model_folder) not in text


async def test_a_voice_saved_with_an_absolute_model_path_lists_the_folders_name(
    app_with: Callable[..., Awaitable[TestClient]],
) -> None:
    """Voices saved before this change recorded the ``--model`` path as given."""
    http = await app_with()
    store = http.server.app[VOICES_KEY]
    stored = VoiceInfo("voice_0123456789abcdef", "old", None, "/home/someone/models/VoxCPM2", 1.0, 0)
    assert stored.to_json()["model"] == "VoxCPM2"
    hub = VoiceInfo("voice_0123456789abcdef", "old", None, "openbmb/VoxCPM2", 1.0, 0)
    assert hub.to_json()["model"] == "openbmb/VoxCPM2"
    assert store.model == Path(store.model).name  # what new voices record
