"""Asyncio helpers the clients share: coroutines that succeed or fail together, and lines from a blocking stream."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Coroutine
from typing import Any, TextIO


async def together(*work: Coroutine[Any, Any, Any]) -> list[Any]:
    """Run ``work`` concurrently; the first failure cancels the rest and is raised (no ExceptionGroup)."""
    tasks = [asyncio.ensure_future(coroutine) for coroutine in work]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            if (error := task.exception()) is not None:
                raise error
        return [task.result() for task in tasks]
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def lines_of(stream: TextIO) -> AsyncIterator[str]:
    """Each line of ``stream`` as soon as it is complete (the last one may lack its newline).

    A daemon thread does the blocking reads, so a pipe that stays open never keeps the process from exiting.
    """
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[str | None] = asyncio.Queue()

    def pump() -> None:
        # The loop may be gone by the time a late line arrives: nobody wants it then.
        with contextlib.suppress(RuntimeError):
            while line := stream.readline():
                loop.call_soon_threadsafe(queue.put_nowait, line)
            loop.call_soon_threadsafe(queue.put_nowait, None)

    threading.Thread(target=pump, name="voxwire-stdin", daemon=True).start()
    while (line := await queue.get()) is not None:
        yield line
