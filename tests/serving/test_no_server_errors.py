"""docs/http-api.md promises that no client input produces a 500. This walks the inputs a hostile probe (issue 20,
item 7) turned into 500s with tracebacks, and asserts each is a typed 4xx that names the problem and reveals no
server path: a number too large for a float, and persona folders that loop, are too long, or are not readable."""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import pytest_asyncio
from aiohttp import web
from aiohttp.test_utils import TestClient

from .conftest import Serve

pytestmark = pytest.mark.asyncio

Client = Callable[..., Awaitable[TestClient]]

HUGE = "1" + "0" * 400
"""10**400: valid JSON, an int Python parses, and no float can hold it."""


@pytest.fixture
def lora_root(tmp_path: Path) -> Path:
    root = tmp_path / "loras"
    root.mkdir()
    os.symlink(root / "loop-b", root / "loop-a")
    os.symlink(root / "loop-a", root / "loop-b")
    (root / "locked").mkdir()
    return root


@pytest_asyncio.fixture
async def http(
    serve: Serve, persona_app: Callable[..., web.Application], aiohttp_client: Client, lora_root: Path
) -> TestClient:
    return await aiohttp_client(await serve(app=persona_app(lora_root=lora_root)))


async def _post(http: TestClient, path: str, text: str) -> tuple[int, dict[str, object]]:
    async with http.post(path, data=text, headers={"Content-Type": "application/json"}) as response:
        return response.status, await response.json()


async def test_a_number_no_float_can_hold_is_a_400_on_speech(http: TestClient) -> None:
    status, body = await _post(http, "/v1/audio/speech", '{"input": "Hello.", "cfg_value": ' + HUGE + "}")
    assert status == 400, body
    error = body["error"]
    assert isinstance(error, dict) and error["code"] == "invalid_parameter" and "cfg_value" in error["message"]
    assert len(json.dumps(body)) < 500  # the 400-digit number is not echoed whole


async def test_a_number_no_float_can_hold_is_a_4xx_on_generate(http: TestClient) -> None:
    status, body = await _post(http, "/generate", '{"target_text": "Hello.", "cfg_value": ' + HUGE + "}")
    assert 400 <= status < 500, body
    assert "cfg_value" in json.dumps(body)


@pytest.mark.parametrize(
    "path",
    ["loop-a", "x" * 5000, "a/" * 3000 + "b"],
    ids=["a-loop-of-links", "a-name-too-long", "a-path-too-long"],
)
async def test_persona_paths_the_file_system_refuses_are_invalid_path(
    http: TestClient, lora_root: Path, path: str
) -> None:
    status, body = await _post(http, "/v1/loras", json.dumps({"name": "B", "path": str(lora_root / path)}))
    assert status == 400, body
    error = body["error"]
    assert isinstance(error, dict) and error["code"] == "invalid_path"
    assert str(lora_root.resolve()) not in str(error["message"]).replace(str(lora_root / path), "")


async def test_a_persona_folder_the_server_may_not_read_is_invalid_path(
    http: TestClient, lora_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tests run as root, which may read anything: the server is shown the error a user without access gets."""
    locked = lora_root / "locked"
    real_is_dir = Path.is_dir

    def is_dir(self: Path) -> bool:
        if self == locked.resolve():
            raise PermissionError(13, "Permission denied", str(self))
        return real_is_dir(self)

    monkeypatch.setattr(Path, "is_dir", is_dir)
    status, body = await _post(http, "/v1/loras", json.dumps({"name": "B", "path": str(locked)}))
    assert status == 400, body
    error = body["error"]
    assert isinstance(error, dict) and error["code"] == "invalid_path"
    assert "Permission denied" not in str(error["message"])


@pytest.mark.parametrize(
    ("path", "content_type", "body"),
    [
        ("/v1/voices", "multipart/form-data; boundary=zzz", b"garbage"),  # the boundary never appears
        ("/v1/voices", "multipart/form-data; boundary=zzz", b"--zzz\r\n" + b"X: x\r\n" * 200),  # too many headers
        ("/v1/audio/speech", "application/json", b"\x1f\x8b\x08\x00" + bytes(20)),  # not the gzip it claims
        ("/v1/voices", "multipart/form-data; boundary=zzz", b"\x1f\x8b\x08\x00" + bytes(20)),
    ],
    ids=["no-boundary", "part-headers", "speech-gzip", "upload-gzip"],
)
async def test_a_body_that_cannot_be_read_is_a_400(http: TestClient, path: str, content_type: str, body: bytes) -> None:
    """Probe 4's F8: both were 500s with an ERROR traceback."""
    headers = {"Content-Type": content_type}
    if body.startswith(b"\x1f\x8b"):
        headers["Content-Encoding"] = "gzip"
    async with http.post(path, data=body, headers=headers) as response:
        status, answer = response.status, await response.json()
    assert (status, answer["error"]["code"]) == (400, "invalid_request"), answer
