"""Every HTTP response (errors, streams, the WebSocket 101) carries ``X-Request-Id``: the client's own when it is
well-formed, else a fresh one; error bodies and the access log line carry the same id, and the OpenAI SDK reads it."""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import re

import openai
import pytest
from aiohttp.test_utils import TestClient

from voxwire.protocol.wire import STREAM_PATH

pytestmark = pytest.mark.asyncio

GENERATED = re.compile(r"req_[0-9a-f]{24}")
SPEECH = {"model": "tts-1", "input": "Name this request.", "voice": "alloy", "response_format": "pcm", "seed": 1}


async def test_every_response_names_its_request_and_errors_repeat_the_name(client: TestClient) -> None:
    seen = []
    async with client.get("/health") as response:
        assert response.status == 200
        seen.append(response.headers["X-Request-Id"])
    async with client.post("/v1/audio/speech", json=SPEECH) as response:
        assert response.status == 200 and len(await response.read()) > 0  # a chunked stream
        seen.append(response.headers["X-Request-Id"])
    for method, path, status, code in [
        ("GET", "/no/such/route", 404, "not_found"),
        ("DELETE", "/v1/voices/voice_0123456789abcdef", 404, "unknown_voice"),
        ("PUT", "/v1/audio/speech", 405, "method_not_allowed"),
    ]:
        async with client.request(method, path) as response:
            body = await response.json()
            assert (response.status, body["error"]["code"]) == (status, code)
            assert body["error"]["request_id"] == response.headers["X-Request-Id"]
            seen.append(response.headers["X-Request-Id"])
    assert all(GENERATED.fullmatch(name) for name in seen), seen
    assert len(set(seen)) == len(seen)  # a fresh id each time


async def test_the_websocket_upgrade_names_its_request(client: TestClient) -> None:
    handshake = {
        "Connection": "Upgrade",
        "Upgrade": "websocket",
        "Sec-WebSocket-Version": "13",
        "Sec-WebSocket-Key": base64.b64encode(os.urandom(16)).decode(),
        "X-Request-Id": "agent-7/turn-3",
    }
    async with client.get(STREAM_PATH, headers=handshake) as response:
        assert response.status == 101
        assert response.headers["X-Request-Id"] == "agent-7/turn-3"
    async with client.ws_connect(STREAM_PATH) as ws:  # the same through a WebSocket client
        assert GENERATED.fullmatch(ws._response.headers["X-Request-Id"])


async def test_a_clients_own_id_is_echoed_in_headers_and_error_bodies(client: TestClient) -> None:
    mine = "3f9c2b7e-51d4-4a8e-9a65-0c7f2d1e8b44"
    async with client.post("/v1/audio/speech", json=SPEECH, headers={"X-Request-Id": mine}) as response:
        await response.read()
        assert (response.status, response.headers["X-Request-Id"]) == (200, mine)
    bad = {**SPEECH, "speed": 9.0}
    async with client.post("/v1/audio/speech", json=bad, headers={"X-Request-Id": mine}) as response:
        assert response.status == 400
        assert response.headers["X-Request-Id"] == mine
        error = (await response.json())["error"]
        assert set(error) == {"code", "message", "request_id"}
        assert (error["code"], error["request_id"]) == ("invalid_parameter", mine) and "speed" in error["message"]


@pytest.mark.parametrize(
    "sent",
    [
        pytest.param("x" * 129, id="too-long"),
        pytest.param("two words", id="space"),
        pytest.param('say "hi"', id="quotes"),
        pytest.param("<script>alert(1)</script>", id="markup"),
        pytest.param("a,b", id="list"),
        pytest.param("", id="empty"),
    ],
)
async def test_a_malformed_id_is_replaced_never_echoed(client: TestClient, sent: str) -> None:
    async with client.get("/no/such/route", headers={"X-Request-Id": sent}) as response:
        body = await response.text()
        assert response.status == 404
        assert GENERATED.fullmatch(response.headers["X-Request-Id"])
        assert response.headers["X-Request-Id"] in body
        assert not sent or sent not in body


async def test_the_longest_id_kept_is_128_characters(client: TestClient) -> None:
    longest = "a" * 128
    async with client.get("/health", headers={"X-Request-Id": longest}) as response:
        assert response.headers["X-Request-Id"] == longest


async def test_the_access_log_line_ends_with_the_request_id(client: TestClient, caplog) -> None:
    caplog.set_level(logging.INFO, logger="voxwire.access")
    async with client.get("/v1/voices", headers={"X-Request-Id": "trace-me-1"}):
        pass
    async with client.get("/ready") as response:
        made = response.headers["X-Request-Id"]
    await asyncio.sleep(0.1)  # aiohttp logs once the response is written
    lines = [record.getMessage() for record in caplog.records if record.name == "voxwire.access"]
    assert any("/v1/voices" in line and line.endswith(" trace-me-1") for line in lines)
    assert any("/ready" in line and line.endswith(f" {made}") for line in lines), lines


async def test_the_openai_sdk_reads_the_request_id(client: TestClient) -> None:
    sdk = openai.AsyncOpenAI(base_url=str(client.make_url("/v1")), api_key="unused", max_retries=0)
    speech = sdk.audio.speech.with_raw_response
    raw = await speech.create(model="tts-1", voice="nova", input="Hi.", response_format="pcm")
    assert GENERATED.fullmatch(raw.request_id or "")
    assert len(raw.content) > 0
    raw = await speech.create(
        model="tts-1", voice="nova", input="Hi.", response_format="pcm", extra_headers={"X-Request-Id": "lk-42"}
    )
    assert raw.request_id == "lk-42"
    with pytest.raises(openai.NotFoundError) as refused:
        await sdk.audio.speech.create(model="tts-1", voice="voice_0123456789abcdef", input="Hi.")
    assert refused.value.code == "unknown_voice"
    assert GENERATED.fullmatch(refused.value.request_id or "")
    assert refused.value.response.json()["error"]["request_id"] == refused.value.request_id
    page = await sdk.models.with_raw_response.list()
    assert GENERATED.fullmatch(page.request_id or "")
    await sdk.close()


async def test_nanovllm_error_bodies_carry_the_request_id(client: TestClient) -> None:
    async with client.post("/generate", json={}, headers={"X-Request-Id": "nv-1"}) as response:
        body = await response.json()
        assert response.status == 422 and isinstance(body["detail"], list)
        assert body["request_id"] == "nv-1"
    async with client.post("/generate", json={"target_text": "Hi.", "temperature": 0.5}) as response:
        body = await response.json()
        assert response.status == 400 and isinstance(body["detail"], str)
        assert body["request_id"] == response.headers["X-Request-Id"]


async def test_a_browser_page_may_send_and_read_the_request_id(serve, aiohttp_client) -> None:
    page = "https://app.example"
    client = await aiohttp_client(await serve(allowed_origins=(page,)))
    preflight = {
        "Origin": page,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "traceparent",
    }
    async with client.options("/v1/audio/speech", headers=preflight) as response:
        assert response.status == 204
        allowed = {name.strip().lower() for name in response.headers["Access-Control-Allow-Headers"].split(",")}
        assert {"x-request-id", "traceparent", "tracestate"} <= allowed
    async with client.get("/v1/voices", headers={"Origin": page}) as response:
        exposed = {name.strip().lower() for name in response.headers["Access-Control-Expose-Headers"].split(",")}
        assert "x-request-id" in exposed
