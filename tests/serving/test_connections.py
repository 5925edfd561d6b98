"""What one client's connections may hold of the server (issue 29, probe 4's F3 and F9; ``http.connections``).

A client that pipelines requests and never reads the answers is cut off at the write deadline (its socket freed);
a process holds at most ``--max-http-connections`` HTTP connections; malformed requests are logged a line per
interval, never with a traceback.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable

import pytest
from aiohttp.test_utils import TestServer

pytestmark = pytest.mark.asyncio


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def wait_until(condition: Callable[[], bool], timeout: float) -> None:
    async def poll() -> None:
        while not condition():
            await asyncio.sleep(0.05)

    await asyncio.wait_for(poll(), timeout)


def non_reader(server: TestServer, request: bytes, times: int) -> socket.socket:
    """A client with a small receive buffer that pipelines ``request`` ``times`` times and never reads."""
    assert server.port is not None
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    client.connect((server.host, server.port))
    client.sendall(request * times)
    return client


@pytest.mark.parametrize("path", ["/openapi.json", "/docs", "/client/client.js"])
async def test_a_client_that_never_reads_is_cut_off_at_the_write_deadline(serve, path: str) -> None:
    """Probe 4's F3: keyless clients pipelining a public resource held their sockets (and megabytes of kernel
    memory) for as long as they liked. Each path is sent its own way (a JSON body, a file)."""
    server = await serve(write_timeout_s=0.5, api_keys=("k",))
    before = open_fds()
    most = before

    def only_the_clients_left() -> bool:
        nonlocal most
        most = max(most, open_fds())
        return most >= before + 2 * len(clients) and open_fds() == before + len(clients)

    request = f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
    clients = [await asyncio.to_thread(non_reader, server, request, 400) for _ in range(3)]
    try:
        # The server accepted each client (a socket of its own; a file it sends opens one more for a moment), then
        # freed its socket: the client's is left.
        await wait_until(only_the_clients_left, timeout=20.0)
        for client in clients:
            client.settimeout(5.0)
            with pytest.raises(ConnectionResetError):  # aborted: after what had arrived, a reset, not an end
                while client.recv(64 * 1024):
                    pass
    finally:
        for client in clients:
            client.close()


async def test_a_client_that_reads_slowly_is_not_cut_off(serve, aiohttp_client) -> None:
    """The deadline runs while the client reads nothing, not for the whole response."""
    client = await aiohttp_client(await serve(write_timeout_s=0.5))
    async with client.get("/openapi.json") as response:
        body = b""
        while chunk := await response.content.read(16 * 1024):
            body += chunk
            await asyncio.sleep(0.2)  # a pause shorter than the deadline between reads
    assert response.status == 200 and body.startswith(b"{")


async def connect(server: TestServer) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    assert server.port is not None
    return await asyncio.open_connection(server.host, server.port)


async def test_a_connection_over_the_cap_is_refused_with_503_busy(serve) -> None:
    server = await serve(max_http_connections=2)
    held = [await connect(server) for _ in range(2)]
    reader, writer = await connect(server)
    refusal = await asyncio.wait_for(reader.read(), 5.0)  # answered and closed without a request
    assert refusal.startswith(b"HTTP/1.1 503 "), refusal[:100]
    assert b'"code": "busy"' in refusal and b"Retry-After: 1" in refusal
    writer.close()
    held.pop()[1].close()  # one leaves: its place is free again
    await asyncio.sleep(0.2)
    reader, writer = await connect(server)
    writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    answer = await asyncio.wait_for(reader.read(), 5.0)
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:100]
    writer.close()
    for _, held_writer in held:
        held_writer.close()


async def test_a_websocket_leaves_the_http_cap_to_http(serve, aiohttp_client) -> None:
    """WebSockets have their own cap (``--max-connections``): an upgraded one stops counting as HTTP."""
    client = await aiohttp_client(await serve(max_http_connections=1))
    async with client.ws_connect("/v1/tts/stream"):
        await asyncio.sleep(0.1)
        async with client.get("/health") as response:
            assert response.status == 200


GZIP_THAT_IS_NOT = b"\x1f\x8b\x08\x00" + bytes(20)
"""A gzip header and then zeros: a body no ``Content-Encoding: gzip`` decoder can read."""

MALFORMED = [
    b"GET /health HTTP/1.1\r\nHost: x\r\nX-A: a\rb\r\n\r\n",  # a bare CR in a header value
    *(
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\n"
        f"Content-Length: {len(GZIP_THAT_IS_NOT)}\r\n\r\n".encode()
        + GZIP_THAT_IS_NOT
        for path in ("/v1/audio/speech", "/health")  # answered 401 and 405 without a key, then the body is drained
    ),
]


async def test_malformed_requests_are_logged_a_line_per_interval_without_traceback(serve, caplog) -> None:
    """Probe 4's F9: each malformed request logged an ERROR with a traceback quoting the client's bytes."""
    caplog.set_level(logging.INFO)
    server = await serve(api_keys=("k",))
    caplog.clear()  # the start-up's phase lines are not the requests'
    for _ in range(50):
        for request in MALFORMED:
            reader, writer = await connect(server)
            writer.write(request)
            answer = await asyncio.wait_for(reader.read(), 5.0)
            assert answer.split(b" ")[1] in (b"400", b"401", b"405"), answer[:100]
            writer.close()
    lines = [record for record in caplog.records if record.name != "voxwire.access"]  # one line per request there
    assert not [record for record in lines if record.exc_info or record.levelno >= logging.ERROR]
    assert 1 <= len(lines) <= 2, [record.getMessage() for record in lines]
