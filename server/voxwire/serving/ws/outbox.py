"""``Outbox``: one WebSocket session's ordered output, with coalescing and a bound on unsent audio.

The session's producers (one task per utterance) put messages and encoded audio here without
waiting; one sender task writes them to the socket in the order they were put. The rule
(engineering-style practice 5):

* Audio blocks of one utterance that are waiting together leave as one binary frame, so a producer
  ahead of the socket makes fewer, larger messages instead of a longer queue.
* Audio put but not yet accepted by the socket (the frame being written included) is counted in
  seconds. A put that would take it past ``max_unsent_s`` raises ``SlowConsumerError`` and queues
  nothing: the session then closes the connection. Audio is never dropped silently and never
  buffered without bound.
* ``drop`` removes an utterance's audio and its ``segment`` and ``words`` messages that have not been sent
  (after a cancel), so a client hears at most what the socket already took.

Each utterance's ``Delivery`` learns, as its frames are written, how much audio went out and when
the first frame did; a ``done`` message is built from it when its turn to be sent comes.
What is put here are typed events (our ``ServerMessage``s, ``AudioFrame``s, a context's end, a normal close); the
``Transport`` writes each in its dialect's bytes. This module knows events and counters, not bytes, engines,
encoders or the state machine.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from voxwire.protocol.wire import AudioFrame, CloseCode, Segment, ServerMessage, Words


class Transport(Protocol):
    """The socket as the session sees it: typed events in, its dialect's bytes out (``handler.Socket`` for ours), and
    a close that never hangs."""

    async def send(self, message: ServerMessage) -> None: ...

    async def send_frame(self, frame: AudioFrame, audio_transport: str) -> None:
        """``audio_transport``: how the utterance's ``start`` asked its audio to be carried (``binary``, ``json``)."""
        ...

    async def end_context(self, context_id: str | None) -> None:
        """The context is over (``session_core.SendContextEnd``)."""
        ...

    async def close(self, code: CloseCode, reason: str) -> None: ...


class SlowConsumerError(Exception):
    """The client is not reading: more audio than allowed is waiting for the socket."""


@dataclass
class Delivery:
    """What the socket has taken of one utterance's audio so far."""

    utterance: int
    format: str
    context_id: str | None = None
    transport: str = "binary"
    """``binary``: binary frames; ``json``: ``audio`` text frames (base64)."""
    sent_s: float = 0.0
    first_sent_at: float | None = None
    """``time.monotonic()`` when the first frame was written."""
    frames: int = 0


@dataclass
class _Audio:
    delivery: Delivery
    blocks: list[bytes]
    seconds: float


@dataclass
class _Message:
    build: Callable[[], ServerMessage]
    utterance: int | None = None
    """Set for ``segment`` events, which ``drop`` removes along with their audio."""
    sent: Callable[[], object] | None = None


@dataclass
class _ContextEnd:
    context_id: str | None


@dataclass
class _Close:
    """A normal close, once everything before it is sent."""


_Item = _Audio | _Message | _ContextEnd | _Close


@dataclass
class Outbox:
    """See the module docstring. Create it on the event loop; run ``run()`` as the session's sender task."""

    transport: Transport
    max_unsent_s: float
    unsent_s: float = 0.0
    peak_unsent_s: float = 0.0
    """Largest backlog seen, in seconds of audio (for tests and logs)."""
    _items: deque[_Item] = field(default_factory=deque)
    _ready: asyncio.Event = field(default_factory=asyncio.Event)

    def put(
        self, message: ServerMessage | Callable[[], ServerMessage], *, sent: Callable[[], object] | None = None
    ) -> None:
        """Queue a JSON message; a callable is called when the message's turn comes (e.g. ``done``), and
        ``sent`` once the socket has taken the message."""
        build = message if callable(message) else _constant(message)
        utterance = message.utterance if isinstance(message, (Segment, Words)) else None
        self._push(_Message(build, utterance, sent))

    def put_audio(self, delivery: Delivery, blocks: list[bytes], seconds: float) -> None:
        """Queue encoded audio of ``seconds`` duration. Raises ``SlowConsumerError`` past the bound."""
        # Something must be waiting already: a bound shorter than one chunk still lets one chunk through.
        if self.unsent_s > 0 and self.unsent_s + seconds > self.max_unsent_s:
            raise SlowConsumerError(f"more than {self.max_unsent_s:g} s of audio is waiting for the client to read it")
        self.unsent_s += seconds
        self.peak_unsent_s = max(self.peak_unsent_s, self.unsent_s)
        self._push(_Audio(delivery, blocks, seconds))

    def put_context_end(self, context_id: str | None) -> None:
        """Tell the client ``context_id`` is over, after what is queued before."""
        self._push(_ContextEnd(context_id))

    def put_close(self) -> None:
        """Close the socket normally once everything queued before is sent."""
        self._push(_Close())

    def drop(self, utterance: int) -> None:
        """Forget the unsent audio and segment events of ``utterance``."""
        kept: deque[_Item] = deque()
        for item in self._items:
            if isinstance(item, _Audio) and item.delivery.utterance == utterance:
                self.unsent_s -= item.seconds
            elif not (isinstance(item, _Message) and item.utterance == utterance):
                kept.append(item)
        self._items = kept
        if not kept:
            self._ready.clear()

    async def run(self) -> None:
        """Send forever (until cancelled), in order."""
        while True:
            await self._ready.wait()
            item = self._items.popleft()
            if isinstance(item, _Audio):
                item = self._coalesce(item)
            if not self._items:
                self._ready.clear()
            match item:
                case _Message():
                    await self.transport.send(item.build())
                    if item.sent is not None:
                        item.sent()
                case _Audio():
                    await self._send_audio(item)
                case _ContextEnd(context_id):
                    await self.transport.end_context(context_id)
                case _Close():
                    await self.transport.close(CloseCode.NORMAL, "")

    def _coalesce(self, first: _Audio) -> _Audio:
        """``first`` joined with the audio of the same utterance queued right behind it."""
        blocks, seconds = list(first.blocks), first.seconds
        while self._items and isinstance(head := self._items[0], _Audio) and head.delivery is first.delivery:
            self._items.popleft()
            blocks += head.blocks
            seconds += head.seconds
        return _Audio(first.delivery, blocks, seconds)

    async def _send_audio(self, audio: _Audio) -> None:
        delivery = audio.delivery
        try:
            if audio.blocks:  # empty when an Opus encoder holds the audio until its 20 ms frame is complete
                blocks = tuple(audio.blocks)
                frame = AudioFrame(
                    delivery.format, delivery.utterance, delivery.frames, blocks, context_id=delivery.context_id
                )
                delivery.frames += 1
                await self.transport.send_frame(frame, delivery.transport)
                if delivery.first_sent_at is None:
                    delivery.first_sent_at = time.monotonic()
        finally:
            self.unsent_s -= audio.seconds
        delivery.sent_s += audio.seconds

    def _push(self, item: _Item) -> None:
        self._items.append(item)
        self._ready.set()


def _constant(message: ServerMessage) -> Callable[[], ServerMessage]:
    return lambda: message
