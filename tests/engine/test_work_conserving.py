"""Work-conserving real-time scheduling (``engine.policy`` rules 2 and 5) and the batch priority (rules B1-B4):
pure decisions first, then an engine driven in virtual time."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.engine.virtual_clock import Clock

from voxwire.engine import EngineConfig, FinishReason, Priority, QueueFullError
from voxwire.engine.cost_model import StepCost
from voxwire.engine.policy import DUE_NOW, RealtimeDecision, RealtimePolicy, RunningRows, WaitingRequests

CHUNK_S = 0.16
BATCH = Priority.BATCH


def _policy(cost: str = "10ms+10ms/row+0.1ms/token", max_ahead_s: float = 1.0) -> RealtimePolicy:
    """10 ms + 10 ms a row: 15 rows fit the 160 ms budget."""
    return RealtimePolicy(StepCost.parse(cost), CHUNK_S, max_ahead_s)


# ---- rule 5: rows run ahead up to their own bound, while the step fits ------------------------------------------


def test_a_row_with_no_lead_bound_runs_every_step_the_budget_allows():
    # An HTTP response (no bound) 30 s ahead still decodes; a WebSocket stream 2 s ahead (bound 1 s) does not.
    rows = RunningRows([30.0, 2.0, 0.5], lead_bounds=[math.inf, None, None])
    assert _policy().decide(0.0, rows, WaitingRequests([]), 0).decode == (0, 2)


def test_a_stream_may_state_a_longer_bound_than_the_engines():
    rows = RunningRows([2.0, 2.0], lead_bounds=[5.0, None])
    assert _policy().decide(0.0, rows, WaitingRequests([]), 0).decode == (0,)


def test_rows_that_may_run_never_make_a_row_that_must_late():
    # Row 0 is due in 50 ms: the step may take 50 ms, so 4 rows in all (10 ms + 4 x 10 ms), not the 15 that fit
    # 160 ms; the other rows are far ahead and unbounded.
    rows = RunningRows([0.05] + [9.0] * 20, lead_bounds=[None] + [math.inf] * 20)
    decision = _policy().decide(0.0, rows, WaitingRequests([]), 0)
    assert decision.decode == (0, 1, 2, 3)
    # A row already late (DUE_NOW) sets no limit: it is late whatever runs.
    rows = RunningRows([DUE_NOW] + [9.0] * 20, lead_bounds=[None] + [math.inf] * 20)
    assert len(_policy().decide(0.0, rows, WaitingRequests([]), 0).decode) == 15


# ---- rules B1-B2: batch takes what real-time leaves ---------------------------------------------------------------


def test_batch_rows_fill_only_what_the_realtime_rows_leave():
    # Ten real-time rows within their bound and ten batch rows, none due: 15 fit, the ten real-time ones first.
    deadlines = [0.5] * 10 + [0.5] * 10
    rows = RunningRows(deadlines, batch=frozenset(range(10, 20)))
    decision = _policy().decide(0.0, rows, WaitingRequests([]), 0)
    assert decision.decode == tuple(range(15))


def test_batch_work_stays_within_the_step_budget_the_live_streams_are_held_to():
    # Rule 7's step budget is 0.5 x 160 = 80 ms: five live rows take 60 ms, so two batch rows join, not ten.
    policy = RealtimePolicy(StepCost.parse("10ms+10ms/row"), CHUNK_S, 1.0, max_step_load=0.5)
    rows = RunningRows([0.5] * 5 + [0.5] * 10, batch=frozenset(range(5, 15)))
    assert policy.decide(0.0, rows, WaitingRequests([]), 0).decode == tuple(range(7))


def test_a_batch_row_never_displaces_a_realtime_row_even_one_far_ahead():
    # Twenty unbounded real-time rows fill the step; the batch row (not yet at its deadline) waits.
    rows = RunningRows([9.0] * 20 + [0.5], lead_bounds=[math.inf] * 21, batch=frozenset({20}))
    assert 20 not in _policy().decide(0.0, rows, WaitingRequests([]), 0).decode


def test_a_batch_row_at_its_deadline_runs_whatever_the_budget():
    rows = RunningRows([0.0] * 20 + [0.0], batch=frozenset({20}))  # twenty due real-time rows: over budget
    assert 20 in _policy().decide(0.0, rows, WaitingRequests([]), 0).decode


def test_batch_requests_are_admitted_only_after_every_realtime_one_and_never_as_a_forced_head():
    # 20-token prompts cost 2 ms each. Batch requests alone: all three fit.
    assert _policy().decide(0.0, RunningRows([]), WaitingRequests([20, 20, 20], realtime=0), 3).admit == 3
    # Behind a real-time request they wait a step: a new stream's first chunk never waits for batch work.
    assert _policy().decide(0.0, RunningRows([]), WaitingRequests([20, 20, 20], realtime=1), 3).admit == 1
    # Sixteen due rows take the budget: a batch request at the head is not forced in.
    assert _policy().decide(0.0, RunningRows([0.0] * 16), WaitingRequests([20], realtime=0), 1).admit == 0


def test_with_no_live_stream_batch_work_takes_whole_steps():
    """B3: an engine whose single row is over the real-time budget (a CPU) still runs every batch row, and admits
    every batch request, when no real-time stream runs."""
    policy = _policy("200ms+10ms/row")  # one row alone: 210 ms, over the 160 ms budget
    rows = RunningRows([5.0] * 6, batch=frozenset(range(6)))
    decision = policy.decide(0.0, rows, WaitingRequests([20] * 3, realtime=0), 3)
    assert (decision.admit, decision.decode) == (3, tuple(range(6)))
    # One real-time row beside them (far ahead, so it skips): the batch rows wait for their deadline again.
    rows = RunningRows([5.0] * 6 + [9.0], lead_bounds=[None] * 6 + [math.inf], batch=frozenset(range(6)))
    assert policy.decide(0.0, rows, WaitingRequests([20] * 3, realtime=0), 3) == RealtimeDecision(0, ())


@given(
    live=st.lists(st.one_of(st.just(DUE_NOW), st.floats(-1.0, 3.0)), max_size=30),
    bounds=st.lists(st.one_of(st.none(), st.just(math.inf), st.floats(0.05, 2.0)), min_size=30, max_size=30),
    offline=st.lists(st.floats(-1.0, 3.0), max_size=10),
    tokens=st.lists(st.integers(1, 800), max_size=8),
    realtime=st.integers(0, 8),
    free=st.integers(0, 8),
    per_row_ms=st.floats(0.0, 40.0),
)
def test_the_priority_rules_hold_for_any_state(live, bounds, offline, tokens, realtime, free, per_row_ms):
    policy = RealtimePolicy(StepCost(0.004, per_row_ms / 1e3, 50e-6), CHUNK_S, 1.0)
    now = 0.0
    deadlines = live + offline
    batch = frozenset(range(len(live), len(deadlines)))
    lead = [policy.lead_bound(bound) for bound in bounds[: len(live)]] + [math.inf] * len(offline)
    rows = RunningRows(deadlines, lead_bounds=bounds[: len(live)] + [None] * len(offline), batch=batch)
    realtime = min(realtime, len(tokens))
    decision = policy.decide(now, rows, WaitingRequests(tokens, realtime=realtime), free)
    decoded = set(decision.decode)
    # Must-run rows always run: real-time ones due (rule 3), batch ones at their deadline (B2).
    assert all(i in decoded for i in range(len(live)) if deadlines[i] - policy.due_within_s <= now)
    assert all(i in decoded for i in batch if deadlines[i] <= now)
    # A real-time row beyond its own bound never runs unless due (rule 5).
    assert all(deadlines[i] - max(lead[i], policy.due_within_s) <= now for i in decoded if i not in batch)
    # Batch comes last (B1-B2): a batch row that merely may run, or a batch request, gets in only if every
    # real-time row within its bound and every real-time request the slots allow got in too.
    eligible = {i for i in range(len(live)) if deadlines[i] - max(lead[i], policy.due_within_s) <= now}
    optional_batch = {i for i in decoded & batch if deadlines[i] > now}
    if optional_batch or decision.admit > realtime:
        assert eligible <= decoded
        assert min(realtime, free) == 0  # and the step admits no real-time request
    # The real-time head is admitted whenever a slot is free; a batch head only within budget.
    if free and realtime:
        assert decision.admit >= 1


# ---- an engine in virtual time --------------------------------------------------------------------------------------


def test_an_idle_engine_runs_an_unbounded_stream_at_its_own_speed(make_realtime_engine, make_request):
    """Issue 31: a whole file on an idle server comes at the engine's speed, not the listener's."""
    engine, _ = make_realtime_engine("4ms+1ms/row")
    engine.add(make_request("file", "x" * 20, max_ahead_s=math.inf))  # 130 chunks: 20.8 s of audio
    clock = Clock(engine)
    while engine.has_unfinished():
        clock.step()
    assert clock.now == pytest.approx(130 * 0.005)  # every step back to back: 32x real time
    # A WebSocket stream (the engine's 1 s bound) is paced by its listener once 1 s ahead.
    engine, _ = make_realtime_engine("4ms+1ms/row")
    engine.add(make_request("live", "x" * 20))
    clock = Clock(engine)
    while engine.has_unfinished():
        clock.step()
    assert clock.now > 130 * CHUNK_S - 1.5


def test_live_streams_stay_on_time_while_files_take_the_rest(make_realtime_engine, make_request):
    """Issue 31's mixed load in small: seven rows fit a step; four live streams (200 ms lead, the engine's 1 s bound)
    need four of them per chunk, two unbounded files share the rest. No live chunk is late, and each file arrives
    faster than it plays."""
    engine, _ = make_realtime_engine("10ms+20ms/row", num_slots=6)
    for index in range(4):
        engine.add(make_request(f"live{index}", "x" * 10, playback_lead_s=0.2))
    for index in range(2):
        engine.add(make_request(f"file{index}", "x" * 10, max_ahead_s=math.inf))
    clock = Clock(engine)
    first_sent: dict[str, float] = {}
    chunks: dict[str, int] = {}
    finished: dict[str, float] = {}
    late = 0
    while engine.has_unfinished():
        for output in clock.step():
            rid = output.request_id
            first_sent.setdefault(rid, clock.now)
            if rid.startswith("live"):  # chunk k plays from first_sent + lead + k chunks
                late += clock.now > first_sent[rid] + 0.2 + chunks.get(rid, 0) * CHUNK_S + 1e-9
            chunks[rid] = chunks.get(rid, 0) + 1
            if output.finished:
                finished[rid] = clock.now
    assert late == 0
    assert set(chunks.values()) == {70}  # every chunk of every stream
    # Faster than real time (they end 7.7 s in, 11.2 s of audio each); paced to their listener they would end
    # past 10 s.
    assert max(finished["file0"], finished["file1"]) < 0.75 * 70 * CHUNK_S


def test_a_batch_stream_never_starves_and_never_takes_a_live_rows_place(make_realtime_engine, make_request):
    """B4: live streams alone fill every step; a batch request still runs at least once every max_batch_gap_s."""
    engine, runner = make_realtime_engine("10ms+10ms/row", num_slots=16, config={"max_batch_gap_s": 0.5})
    for index in range(15):  # 15 rows fill 160 ms: 15 due live streams saturate the engine
        engine.add(make_request(f"live{index}", "x" * 10, playback_lead_s=0.0))
    engine.add(make_request("job", "x" * 3, priority=BATCH))
    clock = Clock(engine)
    decoded_at: list[float] = []
    live_left, live_ended = 15, math.inf
    while engine.has_unfinished():
        started = max(clock.now, engine.next_step_at(clock.now))
        outputs = clock.step()
        if "job" in runner.plans[-1].request_ids:
            decoded_at.append(started)
        live_left -= sum(o.finished and o.request_id != "job" for o in outputs)
        if not live_left:
            live_ended = min(live_ended, clock.now)
    assert len(decoded_at) == 28  # every chunk of the batch request
    gaps = [(a, b - a) for a, b in itertools.pairwise(decoded_at)]
    assert max(gap for _, gap in gaps) <= 0.5 + 0.2  # its deadline, plus at most one step
    # While the live streams filled the steps, the batch row ran only when due: it took no live row's place.
    assert all(gap >= 0.5 - 1e-9 for at, gap in gaps if at + gap < live_ended)


def test_a_batch_request_queues_behind_realtime_ones_until_its_gap_then_as_one(make_realtime_engine, make_request):
    engine, runner = make_realtime_engine("10ms+10ms/row", num_slots=1, config={"max_batch_gap_s": 0.1})
    engine.add(make_request("job", "x", priority=BATCH))
    engine.add(make_request("live", "x"))
    clock = Clock(engine)
    clock.step()
    assert [p.request_id for p in runner.plans[-1].prefills] == ["live"]  # the later real-time request goes first
    engine.add(make_request("live2", "x"))
    while "job" not in {p.request_id for plan in runner.plans for p in plan.prefills}:
        clock.step()
    # Once "live" finished, "job" had waited its gap: it took the slot before "live2", which arrived after it.
    admitted = [p.request_id for plan in runner.plans for p in plan.prefills]
    assert admitted == ["live", "job"]


def test_batch_requests_hold_at_most_their_slots_and_have_their_own_queue(make_realtime_engine, make_request):
    engine, runner = make_realtime_engine(num_slots=4, config={"max_batch_running": 1, "max_waiting": 1})
    for index in range(2):
        engine.add(make_request(f"job{index}", "x" * 5, priority=BATCH))
    with pytest.raises(QueueFullError, match="batch waiting queue is full"):
        for index in range(2, 6):
            engine.add(make_request(f"job{index}", "x" * 5, priority=BATCH))
    engine.add(make_request("live", "x" * 5))  # a full batch queue never refuses a real-time request
    clock = Clock(engine)
    for _ in range(3):
        clock.step()
    admitted = [p.request_id for plan in runner.plans for p in plan.prefills]
    assert admitted == ["live", "job0"]  # the real-time one first, then one batch slot


def test_a_slow_engine_with_no_listener_runs_a_batch_job_back_to_back(make_realtime_engine, make_request):
    """B3 in virtual time: 200 ms steps for 160 ms chunks, and nobody listening: the batch request decodes every step,
    not once per max_batch_gap_s."""
    engine, runner = make_realtime_engine("200ms+10ms/row", config={"max_batch_gap_s": 5.0})
    engine.add(make_request("job", "x" * 3, priority=BATCH))  # 28 chunks
    clock = Clock(engine)
    while engine.has_unfinished():
        clock.step()
    assert len(runner.plans) == 28
    assert clock.now == pytest.approx(28 * 0.21)  # back to back


def test_batch_requests_are_never_shed(make_realtime_engine, make_request):
    engine, _ = make_realtime_engine("10ms+100ms/row", config={"max_step_load": 0.9})
    engine.add(make_request("live", "x"))
    engine.add(make_request("job", "x", priority=BATCH))  # a new real-time stream would be shed here
    assert engine.scheduler.sessions_shed == 0
    clock = Clock(engine)
    outputs = []
    while engine.has_unfinished():
        outputs += clock.step()
    assert {o.finish_reason for o in outputs if o.finished} == {FinishReason.LENGTH}


def test_engine_config_checks_the_batch_settings():
    with pytest.raises(ValueError, match="max_batch_running"):
        EngineConfig(max_batch_running=0)
    with pytest.raises(ValueError, match="max_batch_gap_s"):
        EngineConfig(max_batch_gap_s=0.0)
