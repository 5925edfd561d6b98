"""EngineLoop, the one serving cycle both drivers run (``AsyncEngine``'s thread, an engine process): a step only
when one is due, the load after the step seen by whoever its outputs wake, a stream's first chunk handed over
before the chunks of streams already playing, the listeners' clocks started once the chunks are handed over,
and a drain that ends every stream. Driven here by hand, on a clock the test moves."""

from __future__ import annotations

import math

import pytest

from voxwire.engine import Chunk, EngineStats, FinishReason, OverBudgetError
from voxwire.engine.loop import EngineLoop


class Clock:
    """A clock that moves only when told."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Recorder:
    """A driver's delivery: each step's outputs as handed over, with the loop's stats at that moment."""

    def __init__(self) -> None:
        self.loop: EngineLoop | None = None
        self.batches: list[list[Chunk]] = []
        self.stats: list[EngineStats] = []

    def __call__(self, outputs: list[Chunk]) -> None:
        assert self.loop is not None
        self.batches.append(outputs)
        self.stats.append(self.loop.stats)

    def ids(self, batch: int = -1) -> list[str]:
        return [output.request_id for output in self.batches[batch]]


def new_loop(engine, clock: Clock | None = None) -> tuple[EngineLoop, Recorder]:
    recorder = Recorder()
    loop = EngineLoop(engine, recorder, clock or Clock())
    recorder.loop = loop
    return loop, recorder


def test_a_streams_first_chunk_goes_before_the_chunks_of_streams_already_playing(make_engine, make_request):
    engine, runner = make_engine()
    loop, delivered = new_loop(engine)
    engine.add(make_request("a"))
    engine.add(make_request("b"))
    assert loop.run_due()
    assert delivered.ids() == ["a", "b"]  # both first: the engine's order
    engine.add(make_request("c"))
    engine.add(make_request("d"))
    assert loop.run_due()
    assert runner.plans[-1].request_ids == ("a", "b", "c", "d")  # the engine's rows: the new streams last
    assert delivered.ids() == ["c", "d", "a", "b"]
    assert loop.run_due()
    assert delivered.ids() == ["a", "b", "c", "d"]  # no first chunk: the engine's order


def test_an_id_reused_after_its_final_output_counts_as_a_new_stream(make_engine, make_request):
    engine, _ = make_engine()
    loop, delivered = new_loop(engine)
    engine.add(make_request("a"))
    engine.add(make_request("b", max_len=1))
    loop.run_due()
    assert [o.finish_reason for o in delivered.batches[-1]] == [None, FinishReason.LENGTH]
    engine.add(make_request("b"))
    loop.run_due()
    assert delivered.ids() == ["b", "a"]


def test_the_stats_a_delivery_sees_are_those_after_its_step(make_engine, make_request):
    engine, _ = make_engine()
    loop, delivered = new_loop(engine)
    assert loop.stats.steps == 0 and loop.stats.kv_blocks_total == engine.kv_blocks_total
    for rid in ("a", "b", "c"):
        engine.add(make_request(rid))
    loop.run_due()
    loop.run_due()
    assert [(s.steps, s.running, s.waiting) for s in delivered.stats] == [(1, 3, 0), (2, 3, 0)]
    assert delivered.stats[-1] is loop.stats and loop.stats.kv_blocks_used == engine.kv_blocks_used > 0


def test_the_listeners_clock_starts_once_the_first_chunk_is_handed_over(make_engine, make_request):
    engine, _ = make_engine()
    clock = Clock()

    def slow_hand_over(outputs: list[Chunk]) -> None:
        clock.now += 2.0  # the driver takes its time to hand the chunks over

    loop = EngineLoop(engine, slow_hand_over, clock)
    engine.add(make_request("a"))
    started = clock.now
    loop.run_due()
    assert engine.scheduler.records["a"].first_sent_at == started + 2.0


def test_a_step_runs_only_when_one_is_due(make_engine, make_realtime_engine, make_request):
    engine, runner = make_engine()
    loop, delivered = new_loop(engine)
    assert loop.wait_s() == math.inf and not loop.run_due()  # nothing to do until a request comes
    assert not runner.plans and not delivered.batches
    engine.add(make_request("a"))
    assert loop.wait_s() <= 0 and loop.run_due()

    clock = Clock()
    realtime, realtime_runner = make_realtime_engine()
    loop, delivered = new_loop(realtime, clock)
    realtime.add(make_request("ahead", max_len=50, playback_due=clock.now + 3600))
    assert loop.run_due()  # admitted and decoded once
    steps = len(realtime_runner.plans)
    assert 0 < loop.wait_s() < math.inf  # its listener is far behind it: the next step is due later
    assert not loop.run_due() and len(realtime_runner.plans) == steps
    clock.now += loop.wait_s()
    assert loop.run_due() and delivered.ids() == ["ahead"]


def test_the_drain_ends_every_stream_and_leaves_the_engine_idle(make_engine, make_request):
    engine, runner = make_engine(config={"max_running": 2})
    loop, delivered = new_loop(engine)
    for rid in ("a", "b", "c"):  # c waits for a slot
        engine.add(make_request(rid))
    loop.run_due()
    loop.drain()
    finals = [o for batch in delivered.batches for o in batch if o.finished]
    assert sorted(o.request_id for o in finals) == ["a", "b", "c"]
    assert {o.finish_reason for o in finals} == {FinishReason.ABORTED}
    assert not engine.has_work() and runner.is_empty


def test_queue_waits_run_from_add_to_the_admitting_step_and_count_only_served_requests(make_engine, make_request):
    engine, _ = make_engine(config={"max_running": 1})
    clock = Clock()
    loop, delivered = new_loop(engine, clock)
    loop.add(make_request("a", max_len=1))  # admitted at once, done in its first step
    loop.add(make_request("b"))  # waits for a's slot
    loop.add(make_request("c"))  # aborted while it waits: never served, no wait
    clock.now += 0.02
    loop.run_due()
    engine.abort("c")
    clock.now += 0.1
    loop.run_due()
    assert delivered.ids(0) == ["a"] and "b" in delivered.ids(1)
    waits = loop.stats.queue_waits
    assert waits.count == 2 and waits.total_s == pytest.approx(0.02 + 0.12)
    # Prometheus' buckets (upper bounds inclusive): 20 ms falls in the 25 ms bucket, 120 ms in the 125 ms one.
    cumulative = dict(waits.cumulative())
    assert (cumulative[0.01], cumulative[0.025], cumulative[0.1], cumulative[0.125]) == (0, 1, 1, 2)
    assert loop.stats.step_times.count == loop.stats.steps == 2


def test_a_streams_first_output_carries_its_queue_wait_and_no_other_does(make_engine, make_request):
    engine, _ = make_engine(config={"max_running": 1})
    clock = Clock()
    loop, delivered = new_loop(engine, clock)
    loop.add(make_request("a", max_len=2))
    loop.add(make_request("b", max_len=2))  # waits for a's slot: two steps of 50 ms
    for _ in range(4):
        clock.now += 0.05
        loop.run_due()
    waits = [(o.request_id, o.queued_s) for batch in delivered.batches for o in batch if o.queued_s is not None]
    assert waits == [("a", pytest.approx(0.05)), ("b", pytest.approx(0.15))]
    assert [o.request_id for batch in delivered.batches for o in batch].count("b") >= 2


def test_the_cost_model_learns_each_steps_time_on_the_loops_clock_and_the_stats_show_the_budget(
    make_realtime_engine, make_request
):
    """Issue 29.3: the loop tells the engine how long each step took, so the real-time budget follows a slowed
    machine; the stats (what /metrics shows) carry the measured ratio, the load against the budget, and a shed
    stream as soon as it is refused, not only after the next step."""
    engine, runner = make_realtime_engine("10ms+10ms/row", config={"max_step_load": 0.9})
    clock = Clock()
    execute = runner.execute

    def three_times_slower(plan):
        clock.now += 3 * runner.step_cost.seconds(len(plan.decode_slots))
        return execute(plan)

    runner.execute = three_times_slower
    loop, _ = new_loop(engine, clock)
    assert (loop.stats.step_cost_ratio, loop.stats.step_budget_s) == (1.0, pytest.approx(0.144))
    for rid in ("a", "b", "c"):
        loop.add(make_request(rid, "x" * 20, playback_lead_s=0.0))
    for _ in range(6):
        clock.now += max(0.0, loop.wait_s())
        assert loop.run_due()
    assert loop.stats.step_cost_ratio == pytest.approx(3.0)
    assert loop.stats.step_load_s == pytest.approx(3 * 0.04)  # three streams, 40 ms at the fit
    with pytest.raises(OverBudgetError):
        loop.add(make_request("d", "x" * 20))
    assert loop.stats.sessions_shed == 1
