"""Closing a socket from the server side (``handler.close_and_cut``) ends when its task is cancelled, whatever the
close handshake is doing at that moment: a session's tasks are cancelled when its connection goes, and one that
went on would hold the handler, and a draining server with it, until aiohttp's shutdown timeout (60 s)."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from aiohttp import web

from voxwire.serving.ws.handler import close_and_cut

pytestmark = pytest.mark.asyncio


class HandshakeDoneAtOnce:
    """A socket whose close handshake completes the first time it runs: the client's close answer arrived."""

    async def close(self, *, code: int, message: bytes) -> bool:
        return True


async def test_a_close_cancelled_as_its_handshake_completes_is_cancelled() -> None:
    ws = cast(web.WebSocketResponse, HandshakeDoneAtOnce())
    closing = asyncio.create_task(close_and_cut(ws, None, 1000, b""))
    await asyncio.sleep(0)  # the close handshake is scheduled and will complete on the loop's next turn...
    closing.cancel()  # ...the same turn the session's cancellation reaches the closing task
    with pytest.raises(asyncio.CancelledError):
        await closing


async def test_a_close_whose_handshake_never_ends_is_cut_after_the_timeout(monkeypatch: Any) -> None:
    class NeverAnswered:
        async def close(self, *, code: int, message: bytes) -> bool:
            await asyncio.Event().wait()
            return True

    class Transport:
        aborted = False

        def abort(self) -> None:
            self.aborted = True

    monkeypatch.setattr("voxwire.serving.ws.handler.CLOSE_TIMEOUT_S", 0.01)
    transport = Transport()
    await close_and_cut(cast(web.WebSocketResponse, NeverAnswered()), cast(asyncio.Transport, transport), 1000, b"")
    assert transport.aborted
