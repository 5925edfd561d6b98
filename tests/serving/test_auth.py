"""API keys (header or query token) on every endpoint but the probes; the Origin check on WebSocket upgrades."""

from __future__ import annotations

import pytest
import pytest_asyncio
from aiohttp import WSMsgType, WSServerHandshakeError, web
from aiohttp.test_utils import TestClient

pytestmark = pytest.mark.asyncio

KEYS = ("first-key", "second-key")
PROTECTED = [("GET", "/v1/voices"), ("GET", "/metrics"), ("POST", "/v1/audio/speech"), ("DELETE", "/v1/voices/x")]
TEST_WS = "/test/ws"


async def echo(request: web.Request) -> web.WebSocketResponse:
    """A stand-in WebSocket endpoint: auth and origin rules come from the app's middleware, not the handler."""
    ws = web.WebSocketResponse()
    await ws.prepare(request)
    async for message in ws:
        await ws.send_str(message.data)
    return ws


@pytest_asyncio.fixture
async def secured(serve, app_factory, aiohttp_client) -> TestClient:
    app = app_factory(api_keys=KEYS, allowed_origins=("https://app.example",))
    app.router.add_get(TEST_WS, echo)
    return await aiohttp_client(await serve(app=app))


async def status_and_code(client: TestClient, method: str, path: str, **kwargs: object) -> tuple[int, str | None]:
    async with client.request(method, path, **kwargs) as response:
        body = await response.json() if response.content_type == "application/json" else {}
        return response.status, body.get("error", {}).get("code")


async def test_probes_are_open_and_everything_else_needs_a_key(secured: TestClient) -> None:
    for path in ("/health", "/ready"):
        assert (await status_and_code(secured, "GET", path))[0] == 200
    for method, path in PROTECTED:
        async with secured.request(method, path) as response:
            assert response.status == 401, path
            assert response.headers["WWW-Authenticate"] == "Bearer"
            assert (await response.json())["error"]["code"] == "unauthorized"


@pytest.mark.parametrize(
    ("headers", "query", "status"),
    [
        pytest.param({"Authorization": "Bearer first-key"}, {}, 200, id="bearer-first"),
        pytest.param({"Authorization": "Bearer second-key"}, {}, 200, id="bearer-second"),
        pytest.param({"Authorization": "bearer  second-key "}, {}, 200, id="bearer-case-and-spaces"),
        pytest.param({}, {"token": "first-key"}, 200, id="query-token"),
        pytest.param({"Authorization": "Bearer wrong"}, {}, 401, id="wrong-key"),
        pytest.param({"Authorization": "Bearer first-key-and-more"}, {}, 401, id="longer-key"),
        pytest.param({"Authorization": "Bearer "}, {}, 401, id="empty-bearer"),
        pytest.param({"Authorization": "Basic Zmlyc3Qta2V5"}, {}, 401, id="basic-scheme"),
        pytest.param({}, {"token": ""}, 401, id="empty-token"),
        pytest.param({}, {"token": "wrong"}, 401, id="wrong-token"),
        pytest.param({"Authorization": "Bearer wrong"}, {"token": "first-key"}, 401, id="header-wins"),
    ],
)
async def test_keys_by_header_or_query(secured: TestClient, headers: dict, query: dict, status: int) -> None:
    assert (await status_and_code(secured, "GET", "/v1/voices", headers=headers, params=query))[0] == status


async def test_speech_with_a_key(secured: TestClient) -> None:
    body = {"model": "m", "input": "Authorized.", "response_format": "pcm"}
    async with secured.post("/v1/audio/speech", json=body, headers={"Authorization": "Bearer first-key"}) as r:
        assert r.status == 200 and len(await r.read()) > 0


async def test_websocket_upgrades_need_a_key_and_an_allowed_origin(secured: TestClient) -> None:
    with pytest.raises(WSServerHandshakeError) as refused:
        await secured.ws_connect(TEST_WS)
    assert refused.value.status == 401
    with pytest.raises(WSServerHandshakeError) as refused:
        await secured.ws_connect(TEST_WS, params={"token": "first-key"}, headers={"Origin": "https://evil.example"})
    assert refused.value.status == 403
    for headers in ({"Origin": "https://APP.example"}, {}):  # an allowed origin, or no browser at all
        ws = await secured.ws_connect(TEST_WS, params={"token": "second-key"}, headers=headers)
        await ws.send_str("hi")
        message = await ws.receive()
        assert (message.type, message.data) == (WSMsgType.TEXT, "hi")
        await ws.close()


async def test_without_keys_everything_is_open(serve, app_factory, aiohttp_client) -> None:
    app = app_factory()
    app.router.add_get(TEST_WS, echo)
    client = await aiohttp_client(await serve(app=app))
    for method, path in PROTECTED[:2]:
        assert (await status_and_code(client, method, path))[0] == 200
    ws = await client.ws_connect(TEST_WS, headers={"Origin": "https://anywhere.example"})
    await ws.close()
