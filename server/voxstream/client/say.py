"""``say``: speak text (or a stream of lines) through a server and put the audio in a sink as it arrives.

The text goes out as ``text`` messages, one per line as soon as the line is read, then ``end``; the server
segments sentences and speaks them while more text arrives. Audio frames are read eagerly into a queue and
written by a separate task, so a sink that blocks (speakers play in real time) never stalls the socket,
which the server would otherwise cut off as a slow consumer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable
from dataclasses import dataclass

from voxstream.client.aio import together
from voxstream.client.connection import Connection
from voxstream.client.errors import ServerError
from voxstream.client.output import AudioSink
from voxstream.errors import InvalidInputError
from voxstream.serving.protocol import AudioFrame, Done, End, Error, Segment, Start, Text


@dataclass(frozen=True)
class SayResult:
    """What one ``say`` heard: ``ttfa_s`` is from the first text sent to the first audio frame received."""

    done: Done
    ttfa_s: float | None
    audio_bytes: int


async def say(
    server: str,
    texts: AsyncIterable[str],
    sink: AudioSink,
    *,
    token: str | None = None,
    voice: str | None = None,
    seed: int | None = None,
    max_buffer_delay_ms: int | None = None,
    log: Callable[[str], None] | None = None,
) -> SayResult:
    """Speak ``texts`` (pieces of one utterance, sent as they come) into ``sink``. Raises ``ClientError``s."""
    note = log or (lambda _: None)
    start = Start(voice=voice, format=sink.wire_format, seed=seed, max_buffer_delay_ms=max_buffer_delay_ms)
    async with await Connection.open(server, token) as connection:
        ready = await connection.configure(start)
        note(f"connected: model {ready.model}, {ready.format} at {ready.sample_rate} Hz, voice {ready.voice}")
        sink.open(ready.sample_rate)
        try:
            clock = _Clock()
            audio: asyncio.Queue[bytes | None] = asyncio.Queue()
            _, done, written = await together(
                _send(connection, texts, clock), _receive(connection, audio, clock, note), _write(audio, sink)
            )
        finally:
            sink.close()
    ttfa = clock.ttfa_s
    note(f"done: {done.finish_reason}, {done.audio_s:.2f} s of audio, {done.segments} segment(s)")
    return SayResult(done, ttfa, written)


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


async def _send(connection: Connection, texts: AsyncIterable[str], clock: _Clock) -> None:
    spoken = False
    async for text in texts:
        # Whitespace alone would open an utterance with nothing to say (the server refuses its end).
        if not spoken and not text.strip():
            continue
        clock.text_sent()
        await connection.send(Text(text))
        spoken = True
    if not spoken:
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
