"""The real-time policy in the server's engine driver (``AsyncEngine``: its own clock, ``mark_sent`` when a
step's chunks are handed over), with a runner whose stated step cost exceeds one chunk of audio even for one
row, so every step is over budget: a stream behind its listener decodes in every step while it runs, and a
stream far ahead of its listener yields (it decodes only in the step that admits it). Mechanism assertions on
the plans the runner saw; nothing here depends on how fast the machine is."""

from __future__ import annotations

import asyncio
import time

from voxwire.engine import AsyncEngine


def test_a_stream_behind_is_never_skipped_and_one_far_ahead_yields(make_realtime_engine, make_request) -> None:
    engine, runner = make_realtime_engine(cost="1s+0.1s/row")  # the budget is 0.16 s: every step is over it

    async def main() -> None:
        async with AsyncEngine(engine) as driver:
            ahead = driver.stream(make_request("ahead", max_len=50, playback_due=time.monotonic() + 3600))
            first = await anext(ahead)  # admitted, decoded once (its first chunk comes with that step)
            assert first.audio.size and not first.finished
            steps_before = len(runner.plans)
            behind = make_request("behind", max_len=12, playback_due=time.monotonic() - 10)
            outputs = [output async for output in driver.stream(behind)]
            assert len(outputs) == 12 and outputs[-1].finished
            later = runner.plans[steps_before:]
            decoding = [plan.request_ids for plan in later if plan.request_ids]
            assert len(decoding) == 12 and all(ids == ("behind",) for ids in decoding), decoding
            await ahead.aclose()  # aborts it: it would only run again as its deadline nears

    asyncio.run(asyncio.wait_for(main(), timeout=30))
    assert [plan.request_ids for plan in runner.plans if "ahead" in plan.request_ids] == [("ahead",)]


def test_the_listeners_clock_starts_when_the_first_chunk_is_handed_over(make_realtime_engine, make_request) -> None:
    engine, _ = make_realtime_engine()

    async def main() -> None:
        async with AsyncEngine(engine) as driver:
            before = time.monotonic()
            stream = driver.stream(make_request("new", max_len=500))
            await anext(stream)
            record = engine.scheduler.records["new"]
            # Stamped by the engine thread just after it posted the step's outputs to this loop.
            while record.first_sent_at is None:
                await asyncio.sleep(0.001)
            assert before <= record.first_sent_at <= time.monotonic()
            await stream.aclose()

    asyncio.run(asyncio.wait_for(main(), timeout=30))
