"""Regression tests of issue 8's probe on the HTTP side (defects D5, D6, D9, D11).

Slow clients (headers or body trickling in), secrets in the access log, bodies that broke the
JSON reader, a client that leaves mid-body, and cross-origin pages calling the API.
"""

from __future__ import annotations

import asyncio
import logging

import pytest
from aiohttp import FormData
from aiohttp.test_utils import TestClient, TestServer
from tests.serving.helpers import clip, scrape

from voxwire.serving.runtime.keys import METRICS_KEY

pytestmark = pytest.mark.asyncio

SPEECH = {"model": "m", "input": "Hi.", "response_format": "pcm", "seed": 1}


async def raw_connection(server: TestServer) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    assert server.port is not None
    return await asyncio.open_connection(server.host, server.port)


async def closed_within(reader: asyncio.StreamReader, seconds: float) -> bytes:
    """Everything the server sends until it closes the connection (fails if it keeps it open too long)."""
    return await asyncio.wait_for(reader.read(), seconds)


# ---- D5: header and body read timeouts ---------------------------------------------------------------------


async def test_a_connection_that_never_finishes_its_headers_is_closed(serve) -> None:
    server = await serve(header_timeout_s=0.5)
    idle_reader, idle_writer = await raw_connection(server)  # sends nothing at all
    reader, writer = await raw_connection(server)
    writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ")  # a header trickling in, never ended
    await writer.drain()
    assert await closed_within(reader, 5.0) == b""
    assert await closed_within(idle_reader, 5.0) == b""
    writer.close()
    idle_writer.close()


async def test_a_body_that_does_not_arrive_in_time_gets_408(serve) -> None:
    server = await serve(body_timeout_s=0.5)
    for path, content_type in (("/v1/audio/speech", "application/json"), ("/v1/voices", "multipart/form-data")):
        reader, writer = await raw_connection(server)
        boundary = "; boundary=x" if content_type.startswith("multipart") else ""
        writer.write(
            f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: {content_type}{boundary}\r\n"
            f"Content-Length: 1000\r\n\r\n--x\r\n".encode()
        )
        await writer.drain()
        response = await reader.readuntil(b"}}")
        assert response.startswith(b"HTTP/1.1 408"), response[:100]
        assert b'"body_timeout"' in response
        writer.close()


# ---- D6: no query string in the access log -----------------------------------------------------------------


async def test_the_access_log_never_records_a_token(serve, aiohttp_client, caplog) -> None:
    caplog.set_level(logging.INFO)
    client = await aiohttp_client(await serve(api_keys=("secret-key",)))
    async with client.get("/v1/voices?token=secret-key&x=1", headers={"Referer": "http://page/?token=secret-key"}):
        pass
    async with client.get("/health?token=secret-key"):
        pass
    await asyncio.sleep(0.1)
    lines = [record.getMessage() for record in caplog.records]
    assert not [line for line in lines if "secret" in line]
    assert any("/v1/voices?<redacted>" in line and " 200 " in line for line in lines), lines


# ---- D9: every HTTP failure is typed; a client leaving is not an error --------------------------------------


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        pytest.param(b"[" * 50_000 + b"]" * 50_000, "application/json", id="nested-50k-deep"),
        pytest.param(b'{"input": "hi"}', "application/json; charset=bogus", id="unknown-charset"),
        pytest.param('{"input": "hé"}'.encode("utf-16"), "application/json; charset=ascii", id="wrong-charset"),
    ],
)
async def test_bodies_that_broke_the_json_reader_get_a_typed_400(client: TestClient, body, content_type) -> None:
    async with client.post("/v1/audio/speech", data=body, headers={"Content-Type": content_type}) as response:
        assert response.status == 400
        assert (await response.json())["error"]["code"] == "invalid_json"


async def test_a_body_in_a_declared_charset_is_read(client: TestClient) -> None:
    body = '{"model": "m", "input": "Héllo.", "response_format": "pcm", "seed": 1}'.encode("latin-1")
    headers = {"Content-Type": "application/json; charset=latin-1"}
    async with client.post("/v1/audio/speech", data=body, headers=headers) as response:
        assert response.status == 200


async def test_a_client_leaving_mid_body_is_not_a_server_error(client: TestClient, caplog) -> None:
    caplog.set_level(logging.INFO)
    before = await scrape(client)
    for path in ("/v1/audio/speech", "/v1/voices"):
        _, writer = await raw_connection(client.server)
        writer.write(
            f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=x\r\n"
            f"Content-Length: 100000\r\n\r\n--x\r\n".encode()
        )
        await writer.drain()
        await asyncio.sleep(0.2)
        writer.close()
    dropped = 'voxwire_dropped_sessions_total{reason="client_disconnected"}'
    # The server notices each departure when its body read fails; on a loaded machine that takes a while.
    for _ in range(200):
        after = await scrape(client)
        if after.get(dropped, 0) - before.get(dropped, 0) >= 2:
            break
        await asyncio.sleep(0.05)
    assert not [record for record in caplog.records if record.levelno >= logging.ERROR]
    assert after.get('voxwire_errors_total{code="internal_error"}', 0) == 0
    assert after.get(dropped, 0) - before.get(dropped, 0) == 2
    assert client.server.app[METRICS_KEY] is not None


# ---- D11: Origin enforced on the HTTP API, with proper CORS ------------------------------------------------


ALLOWED, EVIL = "https://app.example", "https://evil.example"


async def test_cross_origin_pages_cannot_call_the_api(serve, aiohttp_client) -> None:
    client = await aiohttp_client(await serve(allowed_origins=(ALLOWED,)))
    # The probe's "simple" requests: no preflight, so only the server can refuse them.
    text_plain = {"Origin": EVIL, "Content-Type": "text/plain"}
    async with client.post("/v1/audio/speech", data=str(SPEECH).replace("'", '"'), headers=text_plain) as response:
        assert (response.status, (await response.json())["error"]["code"]) == (403, "forbidden_origin")
    form = FormData()
    form.add_field("file", clip(0.5), filename="a.wav")
    async with client.post("/v1/voices", data=form, headers={"Origin": EVIL}) as response:
        assert (response.status, (await response.json())["error"]["code"]) == (403, "forbidden_origin")
    async with client.get("/v1/voices") as response:
        assert [voice for voice in (await response.json())["data"] if not voice["builtin"]] == []
    preflight = {"Origin": EVIL, "Access-Control-Request-Method": "POST"}
    async with client.options("/v1/audio/speech", headers=preflight) as response:
        assert response.status == 403
        assert "Access-Control-Allow-Origin" not in response.headers


async def test_allowed_origins_get_cors_answers_and_need_their_key(serve, aiohttp_client) -> None:
    client = await aiohttp_client(await serve(allowed_origins=(ALLOWED,), api_keys=("k",)))
    preflight = {
        "Origin": ALLOWED,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type",
    }
    async with client.options("/v1/audio/speech", headers=preflight) as response:  # no key: browsers send none
        assert response.status == 204
        assert response.headers["Access-Control-Allow-Origin"] == ALLOWED
        assert "POST" in response.headers["Access-Control-Allow-Methods"]
        assert "authorization" in response.headers["Access-Control-Allow-Headers"].lower()
        assert "Origin" in response.headers["Vary"]
    headers = {"Origin": ALLOWED, "Authorization": "Bearer k"}
    async with client.post("/v1/audio/speech", json=SPEECH, headers=headers) as response:
        assert response.status == 200
        assert response.headers["Access-Control-Allow-Origin"] == ALLOWED
        await response.read()
    async with client.post("/v1/audio/speech", json=SPEECH, headers={"Origin": ALLOWED}) as response:
        assert response.status == 401
        assert response.headers["Access-Control-Allow-Origin"] == ALLOWED  # so the page can read the error
    async with client.post("/v1/audio/speech", json=SPEECH, headers={"Authorization": "Bearer k"}) as response:
        assert response.status == 200  # not a browser: no Origin, no CORS
        assert "Access-Control-Allow-Origin" not in response.headers
        await response.read()


async def test_a_client_closing_a_speech_stream_early_is_not_an_error(client: TestClient, caplog) -> None:
    caplog.set_level(logging.INFO)
    before = await scrape(client)
    body = {**SPEECH, "input": "A sentence long enough to stream for several steps before it ends."}
    response = await client.post("/v1/audio/speech", json=body)
    assert response.status == 200
    await response.content.readany()  # some audio arrived: the stream is under way
    response.close()  # the client goes away mid-stream
    for _ in range(100):
        after = await scrape(client)
        if after.get('voxwire_dropped_sessions_total{reason="client_disconnected"}', 0) > before.get(
            'voxwire_dropped_sessions_total{reason="client_disconnected"}', 0
        ):
            break
        await asyncio.sleep(0.05)
    else:
        pytest.fail("the dropped stream was not counted")
    await asyncio.sleep(0.2)
    assert not [record for record in caplog.records if record.levelno >= logging.ERROR]
    assert after.get('voxwire_errors_total{code="internal_error"}', 0) == 0
