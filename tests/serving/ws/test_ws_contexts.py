"""Several contexts on one socket, end to end over the real app and the tiny model: two contexts spoken at the same
time each hear exactly their solo run (the batch-invariant engine makes a request's audio independent of what it
is batched with), cancelling one leaves the other intact, and a client that names no context sees the bytes it
always did."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from aiohttp import WSMsgType

from voxwire.protocol.wire import (
    Audio,
    AudioFrame,
    Cancel,
    CloseContext,
    End,
    Ready,
    Segment,
    Start,
    Text,
)

from .conftest import Connect, Heard, StreamClient

pytestmark = pytest.mark.asyncio

TEXT_A = "The first context speaks this. It has two sentences."
TEXT_B = "A second voice answers at once."


async def hear(
    stream: StreamClient, contexts: set[str | None], order: list[str | None] | None = None
) -> dict[str | None, Heard]:
    """Collect every message until each of ``contexts`` has had a ``done``, sorted by context (``order``: each
    audio frame's context, as they came); audio sent as ``audio`` text messages is turned back into its frame."""
    heard: dict[str | None, Heard] = {context: Heard() for context in contexts}
    while any(heard[context].done is None for context in contexts):
        received = await stream.receive()
        if isinstance(received, Audio):
            received = received.frame()
        assert not isinstance(received, Ready), received
        heard[received.context_id].take(received)
        if isinstance(received, AudioFrame) and order is not None:
            order.append(received.context_id)
    return heard


async def configure(stream: StreamClient, context: str | None, **settings: object) -> Ready:
    await stream.send(Start(format="pcm_f32le", context_id=context, **settings))  # type: ignore[arg-type]
    ready = await stream.expect(Ready)
    assert ready.context_id == context
    return ready


async def solo(ws_server_app: object, connect: Connect, text: str, seed: int) -> np.ndarray:
    """The utterance alone on a fresh connection, in the default context."""
    stream = await connect(ws_server_app)
    await configure(stream, None, seed=seed)
    await stream.send(Text(text))
    await stream.send(End())
    return (await stream.heard()).pcm()


@pytest.mark.slow
@pytest.mark.isa
async def test_two_contexts_at_once_each_hear_their_solo_run(ws_server: Callable, connect: Connect) -> None:
    server = await ws_server(batch_invariant=True)
    stream = await connect(server)
    await configure(stream, "a", seed=11)
    await configure(stream, "b", seed=23)
    await stream.send(Text(TEXT_A, context_id="a"))
    await stream.send(Text(TEXT_B, context_id="b"))
    await stream.send(End(context_id="a"))
    await stream.send(End(context_id="b"))
    order: list[str | None] = []
    heard = await hear(stream, {"a", "b"}, order)

    assert order.index("b") < len(order) - 1 - order[::-1].index("a"), (
        f"the contexts spoke one after the other: {order}"
    )
    assert {frame.context_id for frame in heard["a"].frames} == {"a"}
    a, b = heard["a"], heard["b"]
    assert a.done is not None and b.done is not None and a.done.finish_reason == b.done.finish_reason == "stop"
    assert a.done.context_id == "a" and b.done.context_id == "b" and a.done.utterance != b.done.utterance
    assert [s.text for s in a.segments] == ["The first context speaks this.", "It has two sentences."]
    np.testing.assert_array_equal(a.pcm(), await solo(server, connect, TEXT_A, 11))
    np.testing.assert_array_equal(b.pcm(), await solo(server, connect, TEXT_B, 23))


@pytest.mark.isa
async def test_cancelling_one_context_leaves_the_other_intact(ws_server: Callable, connect: Connect) -> None:
    server = await ws_server(batch_invariant=True)
    stream = await connect(server)
    await configure(stream, "a", seed=11)
    await configure(stream, "b", seed=23)
    await stream.send(Text(TEXT_A + " " + TEXT_A, context_id="a"))
    await stream.send(End(context_id="a"))
    first = await stream.expect(Segment)
    assert first.context_id == "a"
    await stream.send(Text(TEXT_B, context_id="b"))
    await stream.send(End(context_id="b"))
    await stream.send(Cancel(context_id="a"))
    heard = await hear(stream, {"a", "b"})

    a, b = heard["a"], heard["b"]
    assert a.done is not None and a.done.finish_reason == "cancelled"
    assert b.done is not None and b.done.finish_reason == "stop" and not b.errors
    np.testing.assert_array_equal(b.pcm(), await solo(server, connect, TEXT_B, 23))
    # the socket goes on: the cancelled context speaks again, and closing it ends the context
    await stream.send(Text(TEXT_B, context_id="a"))
    await stream.send(CloseContext("a"))
    again = await hear(stream, {"a"})
    assert again["a"].done is not None and again["a"].done.finish_reason == "cancelled"


async def test_a_client_without_contexts_sees_the_bytes_it_always_did(ws_server: Callable, connect: Connect) -> None:
    server = await ws_server()
    stream = await connect(server, read_ready=False)
    texts, frames = [], []
    await stream.send(Start(format="pcm_s16le", seed=3))
    await stream.send(Text("Hello there."))
    await stream.send(End())
    while not texts or '"type":"done"' not in texts[-1]:
        message = await stream.ws.receive(timeout=60)
        if message.type is WSMsgType.BINARY:
            frames.append(message.data)
        else:
            texts.append(message.data)
    assert texts and not any("context_id" in text for text in texts)
    assert frames and all(frame[:4] == bytes([1, 2, 12, 0]) for frame in frames)


async def test_contexts_per_socket_are_limited(ws_server: Callable, connect: Connect) -> None:
    server = await ws_server(max_contexts=1)
    stream = await connect(server)
    await configure(stream, "a")
    await stream.send(Start(context_id="b"))
    error = await stream.error("too_many_contexts")
    assert error.context_id == "b"
    await stream.send(CloseContext("a"))
    await configure(stream, "b")
