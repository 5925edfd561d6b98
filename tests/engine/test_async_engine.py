"""AsyncEngine: ordered per-session delivery, cancellation, a free event loop, clean stop, thread death.

Some assertions read engine or runner state from the loop thread while the engine thread owns it;
they only poll small counters until a condition holds, which is safe enough for a test.
"""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from voxwire.engine import AsyncEngine, DuplicateRequestError, EngineDeadError, FinishReason, QueueFullError


def _run(coro) -> None:
    asyncio.run(asyncio.wait_for(coro, timeout=20))


async def _until(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.005)


async def _collect(engine: AsyncEngine, request) -> list:
    return [output async for output in engine.stream(request)]


def test_concurrent_sessions_get_their_chunks_in_order(make_engine, make_request, chunk_of):
    engine, _ = make_engine()

    async def main() -> None:
        async with AsyncEngine(engine) as ae:
            lengths = {"a": 3, "b": 7, "c": 5}
            streams = [_collect(ae, make_request(rid, max_len=n)) for rid, n in lengths.items()]
            for (rid, n), outputs in zip(lengths.items(), await asyncio.gather(*streams), strict=True):
                assert [o.finish_reason for o in outputs] == [None] * (n - 1) + [FinishReason.LENGTH]
                for i, output in enumerate(outputs):
                    np.testing.assert_array_equal(output.audio, chunk_of(rid, i))

    _run(main())


def test_cancelled_consumer_aborts_its_request_and_frees_the_slot(make_engine, make_request):
    engine, runner = make_engine(delay=0.002)

    async def main() -> None:
        async with AsyncEngine(engine) as ae:
            received: list = []

            async def consume(rid: str) -> None:
                async for output in ae.stream(make_request(rid)):
                    received.append(output.request_id)

            doomed, survivor = asyncio.create_task(consume("a")), asyncio.create_task(consume("b"))
            await _until(lambda: received.count("a") >= 2)
            doomed.cancel()
            await _until(lambda: "a" not in runner.rows and engine.num_running == 1)
            count = received.count("a")
            await _until(lambda: received.count("b") >= count + 3)  # b keeps streaming, a stays silent
            assert received.count("a") == count
            await survivor

    _run(main())


def test_aclose_aborts_and_the_id_can_be_reused(make_engine, make_request):
    engine, runner = make_engine(delay=0.01)  # left alone, "a" would stream 76 chunks (~0.8 s)

    async def main() -> None:
        async with AsyncEngine(engine) as ae:
            stream = ae.stream(make_request("a"))
            await stream.__anext__()
            await stream.aclose()
            # The id stays reserved until the engine thread has applied the abort and delivered
            # the aborted final output, so that no output of the old stream reaches the new one.
            with pytest.raises(DuplicateRequestError):
                await _collect(ae, make_request("a"))
            await _until(lambda: "a" not in runner.rows, timeout=0.3)  # aborted, not run to its end
            while True:
                try:
                    outputs = await _collect(ae, make_request("a", max_len=2))
                    break
                except DuplicateRequestError:
                    await asyncio.sleep(0.005)
            assert [o.finish_reason for o in outputs] == [None, FinishReason.LENGTH]

    _run(main())


@pytest.mark.alone  # it times the event loop's gaps
def test_a_slow_step_never_blocks_the_event_loop(make_engine, make_request):
    engine, _ = make_engine(delay=0.05)

    async def main() -> None:
        gaps: list[float] = []
        done = asyncio.Event()

        async def tick() -> None:
            last = time.monotonic()
            while not done.is_set():
                await asyncio.sleep(0.005)
                now = time.monotonic()
                gaps.append(now - last)
                last = now

        async with AsyncEngine(engine) as ae:
            ticker = asyncio.create_task(tick())
            outputs = await _collect(ae, make_request("a", max_len=6))
            done.set()
            await ticker
        assert len(outputs) == 6
        assert max(gaps) < 0.04, f"the loop stalled for {max(gaps) * 1000:.0f} ms (a step takes 50 ms)"

    _run(main())


def test_idle_engine_thread_sleeps_instead_of_spinning(make_engine, make_request):
    engine, _ = make_engine()
    calls = 0
    has_work = engine.has_work

    def counting_has_work() -> bool:
        nonlocal calls
        calls += 1
        return has_work()

    engine.has_work = counting_has_work

    async def main() -> None:
        async with AsyncEngine(engine) as ae:
            await _collect(ae, make_request("a", max_len=2))
            await asyncio.sleep(0.05)  # let the thread flush the last housekeeping step
            before = calls
            await asyncio.sleep(0.1)
            assert calls == before, "the idle engine thread keeps polling"

    _run(main())


def test_stop_aborts_live_streams_and_joins_the_thread(make_engine, make_request):
    engine, runner = make_engine(delay=0.002)

    async def main() -> None:
        ae = AsyncEngine(engine, thread_name="engine-under-test")
        ae.start()
        assert any(t.name == "engine-under-test" for t in threading.enumerate())
        stream = ae.stream(make_request("a"))
        await stream.__anext__()
        await ae.stop()
        rest = [output async for output in stream]
        assert rest[-1].finish_reason is FinishReason.ABORTED
        assert not any(t.name == "engine-under-test" for t in threading.enumerate())
        assert runner.is_empty and not engine.has_work()
        with pytest.raises(EngineDeadError, match="stopped"):
            await _collect(ae, make_request("b"))

    _run(main())


def test_runner_exception_errors_the_step_and_the_thread_keeps_serving(make_engine, make_request):
    engine, _ = make_engine(fail=lambda plan: "bad" in plan.request_ids)

    async def main() -> None:
        async with AsyncEngine(engine) as ae:
            [failed] = await _collect(ae, make_request("bad"))
            assert failed.finish_reason is FinishReason.ERROR and "injected" in failed.error
            assert (await _collect(ae, make_request("good", max_len=2)))[-1].finish_reason is FinishReason.LENGTH

    _run(main())


class _Fatal(BaseException):
    """Escapes Engine.step's runner guard, standing in for a bug in the engine itself."""


def test_dead_engine_thread_fails_waiting_consumers_instead_of_hanging(make_engine, make_request):
    engine, runner = make_engine()

    def explode(plan):
        raise _Fatal("engine bug")

    runner.execute = explode

    async def main() -> None:
        async with AsyncEngine(engine) as ae:
            with pytest.raises(EngineDeadError, match="engine thread died: _Fatal: engine bug"):
                await _collect(ae, make_request("a"))
            with pytest.raises(EngineDeadError, match="died"):
                await _collect(ae, make_request("b"))

    _run(main())


def test_admission_errors_reach_the_consumer(make_engine, make_request):
    engine, _ = make_engine(delay=0.01, config={"max_running": 1, "max_waiting": 1})

    async def main() -> None:
        async with AsyncEngine(engine) as ae:
            first = ae.stream(make_request("a"))
            await first.__anext__()
            pending = asyncio.create_task(_collect(ae, make_request("b")))
            await _until(lambda: engine.num_waiting == 1)
            with pytest.raises(QueueFullError, match="queue is full"):
                await _collect(ae, make_request("c"))
            with pytest.raises(DuplicateRequestError):
                await _collect(ae, make_request("a"))
            with pytest.raises(ValueError, match=r"^inference_timesteps="):
                await _collect(ae, make_request("d", inference_timesteps=1000))
            await first.aclose()
            assert (await pending)[-1].finish_reason is FinishReason.LENGTH

    _run(main())


def test_late_exit_of_a_finished_stream_does_not_abort_a_newer_one_with_its_id(make_engine, make_request):
    engine, _ = make_engine(delay=0.002)

    async def main() -> None:
        async with AsyncEngine(engine) as ae:
            old = ae.stream(make_request("a", max_len=3))
            await old.__anext__()
            await _until(lambda: engine.num_running == 0)  # finished in the engine, final still unread
            await asyncio.sleep(0.02)  # and its final output dispatched to the old channel
            new = asyncio.create_task(_collect(ae, make_request("a", max_len=40)))
            await _until(lambda: engine.num_running == 1)
            await old.aclose()
            outputs = await new
            assert [o.finish_reason for o in outputs] == [None] * 39 + [FinishReason.LENGTH]

    _run(main())


def test_a_new_streams_first_chunk_is_handed_over_before_the_playing_streams_chunks(make_engine, make_request):
    # The thread runs EngineLoop's rule; what a caller notices is which consumer wakes first in that step.
    engine, runner = make_engine(delay=0.01)
    received: list[tuple[str, int]] = []  # (request id, step index), in the order the consumers got them

    async def consume(ae: AsyncEngine, rid: str, max_len: int) -> None:
        async for output in ae.stream(make_request(rid, max_len=max_len)):
            received.append((rid, int(output.audio[1])))

    async def main() -> None:
        async with AsyncEngine(engine) as ae:
            playing = asyncio.create_task(consume(ae, "a", 30))
            await _until(lambda: len(received) >= 2)
            await consume(ae, "b", 3)
            await playing

    _run(main())
    plan = next(plan for plan in runner.plans if "b" in plan.request_ids)
    assert plan.request_ids == ("a", "b")  # the engine's order that step
    a_step = plan.step_indices[0]
    assert received.index(("b", 0)) < received.index(("a", a_step))
