"""``OutputStreams``: the event-loop half of an engine front end, one queue per unfinished request.

Whatever carries outputs from the engine to the loop (``AsyncEngine``'s thread hop, or the frontend's
IPC from an engine process) hands them to ``dispatch``; each request's consumer iterates ``stream``.
A queue stays registered until its request's final output, so a request id cannot be reused while the
engine may still answer to it, and a consumer that leaves early has its request aborted.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable, Iterable

from voxwire.chunk import Chunk
from voxwire.engine.errors import DuplicateRequestError, EngineDeadError

_Channel = asyncio.Queue[Chunk | BaseException]


class OutputStreams:
    """Per-request output queues on one event loop. Not thread-safe: call it on the loop only."""

    def __init__(self) -> None:
        self._channels: dict[str, _Channel] = {}
        self.closed_reason: str | None = None
        """Set once the engine is gone: why (every later ``open`` raises ``EngineDeadError`` with it)."""

    def __len__(self) -> int:
        return len(self._channels)

    def request_ids(self) -> list[str]:
        """The requests still owed outputs."""
        return list(self._channels)

    def open(self, request_id: str) -> _Channel:
        """Register a request before it is sent to the engine.

        Raises:
            EngineDeadError: the engine is gone.
            DuplicateRequestError: the id belongs to a request that has not had its final output.
        """
        if self.closed_reason is not None:
            raise EngineDeadError(self.closed_reason)
        if request_id in self._channels:
            raise DuplicateRequestError(f"request id {request_id!r} is already in use by an unfinished request")
        channel: _Channel = asyncio.Queue()
        self._channels[request_id] = channel
        return channel

    async def stream(
        self, request_id: str, channel: _Channel, abort: Callable[[str], None]
    ) -> AsyncGenerator[Chunk, None]:
        """Yield the request's outputs up to its final one; leaving early calls ``abort(request_id)``."""
        try:
            while True:
                item = await channel.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finished:
                    return
        finally:
            # Still registered means the engine owes this stream more outputs: the consumer left
            # early. The identity check keeps a late exit from aborting a newer request that
            # reuses the id after this one's final output was dispatched.
            if self._channels.get(request_id) is channel:
                abort(request_id)

    def dispatch(self, outputs: Iterable[Chunk]) -> None:
        for output in outputs:
            channel = self._channels.get(output.request_id)
            if channel is None:
                continue  # failed by close() before these outputs arrived
            channel.put_nowait(output)
            if output.finished:
                del self._channels[output.request_id]

    def reject(self, request_id: str, exc: BaseException) -> None:
        """The engine refused the request (queue full, a bad parameter): its stream raises ``exc``."""
        channel = self._channels.pop(request_id, None)
        if channel is not None:
            channel.put_nowait(exc)

    def close(
        self, reason: str, cause: BaseException | None = None, error_type: type[EngineDeadError] = EngineDeadError
    ) -> None:
        """The engine is gone: every open stream raises ``error_type(reason)`` (an ``EngineDeadError``), and
        ``open`` raises ``EngineDeadError``."""
        if self.closed_reason is None:
            self.closed_reason = reason
        for channel in self._channels.values():
            error = error_type(self.closed_reason)
            error.__cause__ = cause
            channel.put_nowait(error)
        self._channels.clear()
