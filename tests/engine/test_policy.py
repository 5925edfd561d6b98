"""The real-time policy's rules (``engine.policy``): pure decisions first, then an engine driven in virtual time."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.engine.virtual_clock import Clock

from voxwire.engine import Engine, EngineConfig, FinishReason
from voxwire.engine.cost_model import StepCost
from voxwire.engine.policy import (
    DUE_NOW,
    RealtimeDecision,
    RealtimePolicy,
    RunningRows,
    WaitingRequests,
    playback_deadline,
)

CHUNK_S = 0.16


def _policy(cost: str = "10ms+10ms/row+0.1ms/token", max_ahead_s: float = 1.0) -> RealtimePolicy:
    return RealtimePolicy(StepCost.parse(cost), CHUNK_S, max_ahead_s)


def decide(
    policy: RealtimePolicy,
    now: float,
    deadlines: list[float],
    tokens: list[int],
    free_slots: int,
    weights: list[float] | None = None,
    waiting_weights: list[float] | None = None,
) -> RealtimeDecision:
    """Real-time rows only (no batch), each with the policy's lead bound."""
    return policy.decide(now, RunningRows(deadlines, weights), WaitingRequests(tokens, waiting_weights), free_slots)


def test_rows_furthest_ahead_skip_first_when_the_budget_is_short():
    # 10 ms + 10 ms/row: 15 rows fit 160 ms; slacks 0.4-0.9 s are all optional (not yet due).
    policy = _policy()
    deadlines = [0.9, 0.4, 0.8, 0.5, 0.7, 0.6] * 4  # 24 rows
    decision = decide(policy, 0.0, deadlines, [], free_slots=0)
    decoded = [deadlines[i] for i in decision.decode]
    skipped = [deadlines[i] for i in range(len(deadlines)) if i not in decision.decode]
    assert len(decoded) == 15
    assert max(decoded) <= min(skipped)  # 4x0.4, 4x0.5, 4x0.6 and 3 of the four 0.7s decode
    assert sorted(skipped) == [0.7, 0.8, 0.8, 0.8, 0.8, 0.9, 0.9, 0.9, 0.9]


def test_fifo_among_equals():
    policy = _policy("10ms+50ms/row")  # two rows fit
    decision = decide(policy, 0.0, [0.5] * 5, [], free_slots=0)
    assert decision.decode == (0, 1)  # the two that arrived first


def test_due_rows_decode_even_over_budget():
    policy = _policy("10ms+50ms/row")  # two rows fit the budget, but all five are due
    decision = decide(policy, 10.0, [10.1, 9.0, DUE_NOW, 10.2, 10.3], [], free_slots=0)
    assert decision.decode == (0, 1, 2, 3, 4)


def test_rows_more_than_max_ahead_in_front_skip_even_when_they_fit():
    decision = decide(_policy(max_ahead_s=1.0), 0.0, [0.5, 1.01, 3.0], [], free_slots=0)
    assert decision.decode == (0,)


def test_admission_is_budgeted_by_step_time_not_tokens():
    # 10 ms + 10 ms/row + 0.1 ms/token: 100-token requests cost 20 ms each: 7 fit with no rows running.
    assert decide(_policy(), 0.0, [], [100] * 10, free_slots=10).admit == 7
    # Cheap prefill admits everyone a slot allows, however many tokens.
    assert decide(_policy("10ms+1ms/row"), 0.0, [], [5000] * 10, free_slots=8).admit == 8
    # Due rows use the budget first: the head is still admitted (no starvation), nothing more.
    assert decide(_policy(), 0.0, [DUE_NOW] * 20, [100] * 10, free_slots=10).admit == 1


def test_a_row_costs_what_its_timestep_count_costs():
    """Issue 21.4: a request asking for 50 CFM timesteps is budgeted as the rows its sub-step costs, not as one
    default row. 10 ms + 10 ms/row: 15 rows fit the 160 ms budget, so three rows weighing five each do."""
    weights = {10: 1.0, 50: 5.0}
    policy = RealtimePolicy(StepCost.parse("10ms+10ms/row"), CHUNK_S, 1.0, weights.__getitem__)
    assert decide(policy, 0.0, [], [0] * 6, free_slots=6).admit == 6
    assert decide(policy, 0.0, [], [0] * 6, 6, waiting_weights=policy.weights([50] * 6)).admit == 3
    # Running rows weigh the same: ten default rows that are ahead and one heavy due row fill the budget.
    deadlines = [DUE_NOW] + [0.5] * 10
    decision = decide(policy, 0.0, deadlines, [], 0, weights=policy.weights([50] + [10] * 10))
    assert decision.decode == tuple(range(11))
    decision = decide(policy, 0.0, deadlines, [], 0, weights=policy.weights([50] + [50] * 10))
    assert decision.decode == (0, 1, 2)


def test_the_engine_budgets_rows_by_the_runners_row_weight(make_realtime_engine, make_request):
    """A runner that states ``row_weight`` (``ModelRunner``: measured per timestep bucket) has its rows weighed."""
    _, plain = make_realtime_engine("10ms+10ms/row")

    class Weighted(type(plain)):
        def row_weight(self, timesteps: int) -> float:
            return timesteps / 10

    runner = Weighted(step_cost=StepCost.parse("10ms+10ms/row"))
    engine = Engine(runner, EngineConfig(max_running=runner.num_slots, realtime=True))
    for rid in "abcd":
        engine.add(make_request(rid, "x" * 20, inference_timesteps=50))
    Clock(engine).step()
    assert len(runner.plans[-1].prefills) == 3


def test_admission_does_not_let_a_later_request_overtake():
    # 10 ms + 10 ms/row + 0.1 ms/token; 160 ms budget: after the 20 ms head, a 1,300-token one does not fit.
    assert decide(_policy(), 0.0, [], [100, 1300, 1], free_slots=5).admit == 1


@given(
    deadlines=st.lists(st.one_of(st.just(DUE_NOW), st.floats(-1.0, 3.0)), max_size=40),
    tokens=st.lists(st.integers(1, 800), max_size=10),
    free=st.integers(0, 10),
    per_row_ms=st.floats(0.0, 40.0),
    per_token_us=st.floats(0.0, 500.0),
    max_ahead_s=st.floats(0.05, 2.0),
)
def test_rules_hold_for_any_state(deadlines, tokens, free, per_row_ms, per_token_us, max_ahead_s):
    policy = RealtimePolicy(StepCost(0.004, per_row_ms / 1e3, per_token_us / 1e6), CHUNK_S, max_ahead_s)
    now = 0.0
    decision = decide(policy, now, deadlines, tokens, free)
    decoded = set(decision.decode)
    assert list(decision.decode) == sorted(decoded)
    rank = sorted(range(len(deadlines)), key=lambda i: (deadlines[i], i))
    # A row that is behind is never skipped for one that is ahead, and ties go by arrival:
    # the decoded rows are a prefix of the (deadline, arrival) order.
    assert set(rank[: len(decoded)]) == decoded
    # Due rows always decode.
    assert all(i in decoded for i, d in enumerate(deadlines) if d - policy.due_within_s <= now)
    # Rows more than max_ahead_s ahead never do (unless due).
    assert all(deadlines[i] - max(max_ahead_s, policy.due_within_s) <= now for i in decoded)
    # Admission: within the free slots, the head always when a slot is free, the rest within budget.
    assert decision.admit <= min(free, len(tokens))
    if free and tokens:
        assert decision.admit >= 1
    due = sum(d - policy.due_within_s <= now for d in deadlines)
    if decision.admit > 1:
        assert policy.fits(due + decision.admit, sum(tokens[: decision.admit]))
    # Optional rows only join while the step fits.
    if len(decoded) > due:
        assert policy.fits(len(decoded) + decision.admit, sum(tokens[: decision.admit]))


# ---- an engine in virtual time --------------------------------------------------------------------------------


def slacks(engine: Engine, now: float) -> dict[str, float]:
    """Per running session: audio its listener has left before it needs the next chunk."""
    records = engine.scheduler.records
    lead = engine.config.playback_lead_s
    return {
        rid: playback_deadline(records[rid].playback_start(lead), records[rid].step_index, CHUNK_S) - now
        for rid in engine.scheduler.slots.owners
    }


def test_a_new_sessions_first_chunk_comes_in_the_step_that_admits_it(make_realtime_engine, make_request, chunk_of):
    engine, runner = make_realtime_engine("4ms+50ms/row")  # three rows fit the 160 ms budget
    clock = Clock(engine)
    for rid in "abc":
        engine.add(make_request(rid, "x" * 20, playback_lead_s=0.0))
    clock.step()
    engine.add(make_request("late", "x" * 20))
    outputs = {o.request_id: o for o in clock.step()}
    # The three running streams are due (no lead) and the step is over budget; the newcomer still
    # gets its first chunk in this, its admitting, step.
    assert [p.request_id for p in runner.plans[-1].prefills] == ["late"]
    assert set(outputs) == {"a", "b", "c", "late"}
    np.testing.assert_array_equal(outputs["late"].audio, chunk_of("late", 0))


def test_a_stream_that_is_behind_is_never_skipped_for_one_that_is_ahead(make_realtime_engine, make_request):
    # 25 ms a row: six rows fit a step, and eight streams ask for more than the GPU has. The ones
    # with a long lead can wait; the ones without cannot.
    engine, runner = make_realtime_engine("4ms+25ms/row", num_slots=8)
    leads = dict(zip("abcdefgh", [0.0, 0.0, 0.2, 0.2, 0.6, 0.6, 3.0, 3.0], strict=True))
    for rid, lead in leads.items():
        engine.add(make_request(rid, "x" * 40, playback_lead_s=lead))
    clock = Clock(engine)
    skipped: set[str] = set()
    for _ in range(40):
        before = slacks(engine, clock.now)
        clock.step()
        decoded = set(runner.plans[-1].request_ids) & set(before)
        skipped |= set(before) - decoded
        if decoded != set(before):
            assert max(before[rid] for rid in decoded) <= min(before[rid] for rid in set(before) - decoded)
        assert {"a", "b"} & set(before) <= decoded, "a stream with nothing buffered skipped a step"
    assert {"g", "h"} <= skipped


def test_overload_starves_no_one(make_realtime_engine, make_request):
    # Two rows fit the budget, ten streams want to run on four slots: every one still finishes.
    engine, runner = make_realtime_engine("4ms+60ms/row", num_slots=4)
    for i in range(10):
        engine.add(make_request(f"r{i}", "xxx", playback_lead_s=0.1))
    clock, finished, chunks = Clock(engine), [], Counter()
    while engine.has_unfinished():
        for output in clock.step():
            chunks[output.request_id] += 1
            if output.finished:
                finished.append(output)
    assert {o.finish_reason for o in finished} == {FinishReason.LENGTH}
    assert sorted(o.request_id for o in finished) == sorted(f"r{i}" for i in range(10))
    assert set(chunks.values()) == {3 * 6 + 10}  # every chunk of every stream
    admitted = [p.request_id for plan in runner.plans for p in plan.prefills]
    assert admitted == [f"r{i}" for i in range(10)]  # FIFO admission


def test_sessions_ahead_wait_and_the_engine_says_until_when(make_realtime_engine, make_request):
    engine, runner = make_realtime_engine(config={"max_ahead_s": 1.0})
    engine.add(make_request("cont", "x" * 20, playback_due=5.0))  # a sentence its listener needs at 5 s
    engine.add(make_request("new", "x" * 20, playback_lead_s=2.0))
    clock = Clock(engine)
    clock.step()  # both first chunks, in the admitting step
    sent_at = clock.now
    # "new" plays chunk 1 at sent_at + 2 + 0.16, "cont" at 5.16; both are over 1 s ahead now.
    assert engine.next_step_at(clock.now) == pytest.approx(sent_at + 2.16 - 1.0)
    assert engine.next_step_at(10.0) == 10.0
    plans = len(runner.plans)
    assert engine.step(clock.now) == []  # nobody decodes while everyone is over a second ahead
    assert len(runner.plans) == plans
    assert [o.request_id for o in clock.step()] == ["new"]  # the clock waited for next_step_at
    assert clock.now > sent_at + 1.16


def test_a_faster_listener_makes_its_chunks_due_sooner(make_realtime_engine, make_request):
    """At speed 2 (a tempo change after decoding) the listener plays each 0.16 s chunk in 0.08 s: its stream is
    due twice as often, and ahead of its listener half as long as a stream at 1.0 with the same lead."""
    engine, _ = make_realtime_engine(config={"max_ahead_s": 1.0})
    engine.add(make_request("slow", "x" * 20, playback_lead_s=2.0))
    engine.add(make_request("fast", "x" * 20, playback_lead_s=2.0, playback_speed=2.0))
    clock = Clock(engine)
    clock.step()
    sent_at = clock.now
    # Chunk 1 plays at sent_at + 2 + 0.16 / speed: "fast" first, and it wakes the engine 1 s before then.
    assert engine.next_step_at(clock.now) == pytest.approx(sent_at + 2.08 - 1.0)
    assert [o.request_id for o in clock.step()] == ["fast"]


def test_a_first_chunk_not_marked_sent_counts_as_due(make_realtime_engine, make_request):
    engine, runner = make_realtime_engine()
    engine.add(make_request("a", "x" * 20, playback_lead_s=5.0))
    for _ in range(3):
        engine.step(0.0)  # never mark_sent: the listener's clock never starts, so "a" is due
    assert [plan.request_ids for plan in runner.plans] == [("a",)] * 3


def test_realtime_needs_a_runner_that_states_its_step_cost_and_a_clock(make_engine, make_realtime_engine, make_request):
    with pytest.raises(ValueError, match="needs a runner that states its step cost"):
        make_engine(config={"realtime": True})
    engine, _ = make_realtime_engine()
    engine.add(make_request("a"))
    with pytest.raises(ValueError, match=r"call step\(now\)"):
        engine.step()


def test_a_failed_step_also_fails_the_sessions_that_skipped_it(make_realtime_engine, make_request):
    # After a failed forward pass no row can be trusted, decoded or not.
    engine, runner = make_realtime_engine(fail=lambda plan: plan.request_ids == ("behind",))
    engine.add(make_request("behind", "x" * 20, playback_lead_s=0.0))
    engine.add(make_request("ahead", "x" * 20, playback_lead_s=5.0))
    clock = Clock(engine)
    clock.step()
    outputs = clock.step()
    assert runner.plans[-1].request_ids == ("behind",)
    assert {(o.request_id, o.finish_reason) for o in outputs} == {
        ("behind", FinishReason.ERROR),
        ("ahead", FinishReason.ERROR),
    }
    assert engine.num_running == 0


def test_a_request_waiting_for_kv_blocks_does_not_stall_the_running_ones(make_realtime_engine, make_request):
    # One row fits the budget and the pool holds one request's blocks: "second" waits for blocks,
    # and its place in the budget must not keep "first" from running (it would spin forever).
    engine, _ = make_realtime_engine("4ms+150ms/row", num_kv_blocks=6, block_size=16, prompt_positions=lambda r: 11)
    engine.add(make_request("first", "xx", playback_lead_s=0.4))
    engine.add(make_request("second", "xx", playback_lead_s=0.4))
    clock, finished = Clock(engine), []
    for _ in range(200):
        finished += [o.request_id for o in clock.step() if o.finished]
        if not engine.has_unfinished():
            break
    assert finished == ["first", "second"]


def test_a_step_holding_two_timestep_buckets_is_budgeted_for_its_second_sub_step():
    """Issue 34 D4 through rule 2: rows of another timestep bucket add that bucket's sub-step to the step. One due
    row at 50 timesteps and ten optional rows at 10: the second sub-step's 50 ms leaves room for nine of them."""
    policy = RealtimePolicy(StepCost.parse("10ms+10ms/row+5ms/substep@10+50ms/substep@50"), CHUNK_S, 1.0)
    rows = RunningRows([DUE_NOW] + [0.5] * 10, timesteps=[50] + [10] * 10)
    assert policy.decide(0.0, rows, WaitingRequests([]), 0).decode == tuple(range(10))
    # All in one bucket, the eleven rows fit (120 ms).
    rows = RunningRows([DUE_NOW] + [0.5] * 10, timesteps=[10] * 11)
    assert policy.decide(0.0, rows, WaitingRequests([]), 0).decode == tuple(range(11))
