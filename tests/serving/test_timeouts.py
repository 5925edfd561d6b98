"""``runtime.timeouts.within``: a bounded wait that returns, raises or times out as ``asyncio.wait_for`` does, and
never loses its caller's cancellation (``wait_for`` before Python 3.12 did, in the turn its inner result came)."""

from __future__ import annotations

import asyncio

import pytest

from voxwire.serving.runtime.timeouts import within

pytestmark = pytest.mark.asyncio


async def done_at_once() -> str:
    return "done"


async def test_a_caller_cancelled_in_the_turn_its_result_arrives_is_cancelled() -> None:
    waiting = asyncio.create_task(within(done_at_once(), 1.0))
    await asyncio.sleep(0)  # the inner work is scheduled and completes on the loop's next turn...
    waiting.cancel()  # ...the same turn the caller's cancellation arrives
    with pytest.raises(asyncio.CancelledError):
        await waiting


async def test_a_result_or_an_exception_passes_through() -> None:
    assert await within(done_at_once(), 1.0) == "done"

    async def fails() -> None:
        raise ConnectionResetError("gone")

    with pytest.raises(ConnectionResetError, match="gone"):
        await within(fails(), 1.0)


async def test_work_not_done_in_time_is_cancelled_and_times_out() -> None:
    never = asyncio.get_running_loop().create_future()
    with pytest.raises(asyncio.TimeoutError):
        await within(never, 0.01)
    assert never.cancelled()
