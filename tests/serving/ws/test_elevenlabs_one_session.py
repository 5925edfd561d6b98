"""A socket of the ElevenLabs endpoints is one session, whose limits count what the client does: the idle limit is the
connection's (a client that keeps sending is not idle, whichever context it sends to), and the message budget counts
the client's messages (not the several messages of ours one of theirs stands for)."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import WSMsgType

from .helpers import MULTI, TIMEOUT_S, alignments, receive_until_final

pytestmark = pytest.mark.asyncio


async def test_keep_alives_keep_a_connection_with_a_silent_context_open(serve) -> None:
    server = await serve(idle_timeout_s=1.0)
    async with aiohttp.ClientSession() as session, session.ws_connect(server.make_url(MULTI)) as ws:
        await ws.send_json({"text": " ", "context_id": "quiet"})  # opened, nothing to say yet
        for _ in range(8):  # twice the idle limit, a keep-alive every quarter of it
            await asyncio.sleep(0.25)
            await ws.send_json({"text": ""})
        await ws.send_json({"close_socket": True})
        messages = await receive_until_final(ws)
        closing = await asyncio.wait_for(ws.receive(), TIMEOUT_S)
    assert messages == [{"isFinal": True, "contextId": "quiet"}]
    assert closing.type is WSMsgType.CLOSE and closing.data == 1000


async def test_the_message_budget_counts_the_clients_messages(serve) -> None:
    server = await serve(max_messages_per_s=4.0)
    async with aiohttp.ClientSession() as session, session.ws_connect(server.make_url(MULTI)) as ws:
        for text in ("One. ", "Two. "):  # each stands for a text and a flush of ours (and a start first)
            await ws.send_json({"text": text, "context_id": "a", "flush": True})
        await ws.send_json({"text": "", "context_id": "a", "flush": True})  # the turn's end
        await ws.send_json({"context_id": "a", "close_context": True})  # four messages: the budget's burst
        messages = await receive_until_final(ws)
    assert not [message for message in messages if "error" in message]
    assert len(alignments(messages)) == 2 and messages[-1] == {"isFinal": True, "contextId": "a"}
