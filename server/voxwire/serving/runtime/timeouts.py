"""``within``: await something for at most a while, as ``asyncio.wait_for`` does, without losing a cancellation.

Before Python 3.12, ``wait_for`` returns its inner result normally when the caller is cancelled in the loop turn
that result arrives (a close handshake answered as the session cancels its tasks): the caller's cancellation is
lost, and a task meant to end runs on (a session's outbox then waited forever and held a draining server for
aiohttp's 60 s). ``within`` waits with ``asyncio.wait``, which never swallows the caller's cancellation.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def within(awaitable: Awaitable[T], timeout_s: float) -> T:
    """``awaitable``'s result (or its exception) once it is done; ``asyncio.TimeoutError`` if it is not done within
    ``timeout_s``, after cancelling it and waiting for it to end, as ``wait_for`` does. A cancellation of the
    caller cancels ``awaitable`` and always reaches the caller."""
    task = asyncio.ensure_future(awaitable)
    try:
        done, _ = await asyncio.wait((task,), timeout=timeout_s)
    except BaseException:  # the caller cancelled: the work is not wanted any more
        task.cancel()
        raise
    if not done:
        task.cancel()
        await asyncio.wait((task,))
        raise asyncio.TimeoutError(f"not done within {timeout_s:g} s")
    return task.result()
