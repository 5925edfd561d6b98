"""``say``: speak text (or a stream of lines) through a server and put the audio in a sink as it arrives.

The text goes out as ``text`` messages, one per line as soon as the line is read, then ``end``; the server
segments sentences and speaks them while more text arrives. Audio frames are read eagerly into a queue and
written by a separate task, so a sink that blocks (speakers play in real time) never stalls the socket,
which the server would otherwise cut off as a slow consumer.

A refused connection (a busy, warming-up or draining server: HTTP 503 or close 1013) is tried again with
backoff (``retry.py``). A connection lost mid-utterance (1001, 1006: a replica that was killed or ran out
of drain time) is reported, and the text not yet sent is spoken as a new utterance on a new connection;
what was already sent is not sent again, so no audio is ever played twice (the lost utterance's rest is
skipped).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable
from dataclasses import dataclass, field
from types import TracebackType

from voxwire.client.aio import together
from voxwire.client.connection import Connection
from voxwire.client.errors import ConnectionLostError, ServerError
from voxwire.client.output import AudioSink
from voxwire.client.retry import RetryPolicy, open_with_retry
from voxwire.errors import InvalidInputError
from voxwire.protocol.wire import AudioFrame, Done, End, Error, Segment, Start, Text


@dataclass(frozen=True)
class SayResult:
    """What one ``say`` heard: ``ttfa_s`` is from the first text sent to the first audio frame received."""

    done: Done | None
    """The last utterance's ``done``; None when the connection was lost after all the text had been sent."""
    ttfa_s: float | None
    audio_bytes: int
    interruptions: tuple[ConnectionLostError, ...] = field(default=())
    """Connections lost mid-utterance; each cut its utterance short (the text after it was still spoken)."""


async def say(
    server: str,
    texts: AsyncIterable[str],
    sink: AudioSink,
    *,
    token: str | None = None,
    voice: str | None = None,
    seed: int | None = None,
    max_buffer_delay_ms: int | None = None,
    persona: str | None = None,
    retry: RetryPolicy | None = None,
    log: Callable[[str], None] | None = None,
    warn: Callable[[str], None] | None = None,
) -> SayResult:
    """Speak ``texts`` (pieces of one utterance, sent as they come) into ``sink``. Raises ``ClientError``s.

    ``log`` gets progress notes, ``warn`` the reports of lost connections (both default to nothing)."""
    note = log or (lambda _: None)
    report = warn or (lambda _: None)
    policy = retry or RetryPolicy()
    start = Start(
        voice=voice, format=sink.wire_format, seed=seed, max_buffer_delay_ms=max_buffer_delay_ms, persona=persona
    )
    clock = _Clock()
    audio: asyncio.Queue[bytes | None] = asyncio.Queue()
    writer: asyncio.Task[int] | None = None
    rate: int | None = None
    interruptions: list[ConnectionLostError] = []
    done: Done | None = None
    try:
        async with _Pieces(texts) as pieces:
            while True:
                async with await open_with_retry(server, token, policy, log=note) as connection:
                    ready = await connection.configure(start)
                    replica = f" (replica {connection.replica})" if connection.replica else ""
                    note(
                        f"connected{replica}: model {ready.model}, {ready.format} at {ready.sample_rate} Hz, "
                        f"voice {ready.voice}, persona {ready.persona}"
                    )
                    if rate is None:
                        rate = ready.sample_rate
                        sink.open(rate)
                        writer = asyncio.ensure_future(_write(audio, sink))
                    elif ready.sample_rate != rate:
                        raise ServerError(
                            "sample_rate_changed",
                            f"the new connection speaks at {ready.sample_rate} Hz, the audio so far is at {rate} Hz",
                        )
                    resumed = bool(interruptions)
                    try:
                        _, done = await together(
                            _send(connection, pieces, clock, resumed=resumed), _receive(connection, audio, clock, note)
                        )
                        break
                    except _NothingLeft:
                        break
                    except ConnectionLostError as exc:
                        interruptions.append(exc)
                        done = None
                        more = "" if pieces.finished else "; the text after it goes to a new connection"
                        report(
                            f"connection lost during utterance {len(interruptions)} ({exc.code}, close code "
                            f"{exc.close_code}): the rest of that utterance is skipped{more}"
                        )
                        if pieces.finished:
                            break
    finally:
        audio.put_nowait(None)
        written = 0 if writer is None else await writer
        sink.close()
    if done is not None:
        note(f"done: {done.finish_reason}, {done.audio_s:.2f} s of audio, {done.segments} segment(s)")
    return SayResult(done, clock.ttfa_s, written, tuple(interruptions))


class _NothingLeft(Exception):
    """After a lost connection, the text still to come turned out to be only whitespace: nothing to resume."""


class _Pieces:
    """The text pieces, read ahead by a task of their own so a connection that breaks while waiting for the next
    piece loses none; ``peek`` holds a piece until ``taken``, so a piece a broken connection did not send goes
    to the next connection."""

    def __init__(self, texts: AsyncIterable[str]) -> None:
        self._texts = texts
        self._queue: asyncio.Queue[str | None] = asyncio.Queue()
        self._held: str | None = None
        self._ended = False
        self._failure: BaseException | None = None
        self._pump: asyncio.Task[None] | None = None

    async def __aenter__(self) -> _Pieces:
        self._pump = asyncio.ensure_future(self._read())
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._pump is not None:
            self._pump.cancel()
            await asyncio.gather(self._pump, return_exceptions=True)

    async def _read(self) -> None:
        try:
            async for text in self._texts:
                self._queue.put_nowait(text)
        except Exception as exc:  # raised to the sender, where it ends the run
            self._failure = exc
        finally:
            self._queue.put_nowait(None)

    async def peek(self) -> str | None:
        """The next piece (the same one until ``taken``), or None when there are no more."""
        if self._held is None and not self._ended:
            self._held = await self._queue.get()
            if self._held is None:
                self._ended = True
                if self._failure is not None:
                    raise self._failure
        return self._held

    def taken(self) -> None:
        self._held = None

    @property
    def finished(self) -> bool:
        """Every piece has been sent (or skipped as blank)."""
        return self._ended and self._held is None


class _Clock:
    """Time to first audio, from the first text sent (the server's definition of ``ttfa_s``)."""

    def __init__(self) -> None:
        self.first_text: float | None = None
        self.ttfa_s: float | None = None

    def text_sent(self) -> None:
        if self.first_text is None:
            self.first_text = time.perf_counter()

    def audio_received(self) -> float | None:
        """Record a frame's arrival; the time to first audio when it is the first frame, else None."""
        if self.ttfa_s is not None or self.first_text is None:
            return None
        self.ttfa_s = time.perf_counter() - self.first_text
        return self.ttfa_s


async def _send(connection: Connection, pieces: _Pieces, clock: _Clock, *, resumed: bool) -> None:
    spoken = False
    while (text := await pieces.peek()) is not None:
        # Whitespace alone would open an utterance with nothing to say (the server refuses its end).
        if spoken or text.strip():
            clock.text_sent()
            await connection.send(Text(text))
            spoken = True
        pieces.taken()
    if not spoken:
        if resumed:
            raise _NothingLeft
        raise InvalidInputError("nothing to say: the text is empty")
    await connection.send(End())


async def _receive(
    connection: Connection, audio: asyncio.Queue[bytes | None], clock: _Clock, note: Callable[[str], None]
) -> Done:
    while True:
        message = await connection.receive()
        if isinstance(message, AudioFrame):
            if (ttfa := clock.audio_received()) is not None:
                note(f"time to first audio: {ttfa * 1000:.0f} ms")
            audio.put_nowait(b"".join(message.packets))
        elif isinstance(message, Segment):
            note(f"segment {message.index}: {message.text!r}")
        elif isinstance(message, Error):
            raise ServerError(message.code, message.message)
        elif isinstance(message, Done):
            audio.put_nowait(None)
            return message


async def _write(audio: asyncio.Queue[bytes | None], sink: AudioSink) -> int:
    written = 0
    while (data := await audio.get()) is not None:
        await asyncio.to_thread(sink.write, data)
        written += len(data)
    return written


async def one_text(text: str) -> AsyncIterator[str]:
    yield text
