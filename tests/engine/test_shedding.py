"""Issue 29.3, overload degrades: the real-time policy budgets by the measured step time (``TrackedStepCost``) and
sheds new streams (``engine.policy``, rule 7) before its live streams underrun. Pure decisions first, then an engine
in virtual time on a machine the test slows down, the engine told each step's duration as a server's loop tells it."""

from __future__ import annotations

import pytest

from voxwire.engine import Engine, OverBudgetError, QueueFullError
from voxwire.engine.cost_model import StepCost
from voxwire.engine.policy import RealtimePolicy

CHUNK_S = 0.16
COST = "10ms+10ms/row"
"""With ``max_step_load`` 0.9 the step budget is 144 ms: 13 streams fit at full speed (140 ms), 3 at a third (120)."""


def test_a_new_stream_is_shed_only_when_streams_are_committed_and_the_step_would_exceed_the_budget():
    policy = RealtimePolicy(StepCost.parse(COST), CHUNK_S, 1.0, max_step_load=0.9)
    assert policy.step_budget_s == pytest.approx(0.144)
    assert not policy.sheds(12, 1)  # 140 ms
    assert policy.sheds(13, 1)  # 150 ms
    assert not policy.sheds(0, 50)  # nothing committed: it runs, however long its steps (the engine learns by running)
    assert not RealtimePolicy(StepCost.parse(COST), CHUNK_S, 1.0).sheds(1000, 1)  # no max_step_load: never


class Machine:
    """Virtual time on a machine ``slowdown`` times slower than the runner's cost model: a step lasts that, the
    engine is told so (``step_took``), and its chunks leave at its end."""

    def __init__(self, engine: Engine) -> None:
        self.engine, self.now, self.slowdown = engine, 0.0, 1.0
        self.sent: dict[str, list[float]] = {}
        """Per request: when each of its chunks left."""

    def step(self) -> None:
        self.now = max(self.now, self.engine.next_step_at(self.now))
        runner = self.engine.runner
        plans = len(runner.plans)
        outputs = self.engine.step(self.now)
        seconds = 0.0
        if len(runner.plans) > plans:
            plan = runner.plans[-1]
            tokens = sum(item.prepared.prompt_positions for item in plan.prefills)
            seconds = self.slowdown * runner.step_cost.seconds(len(plan.decode_slots), tokens)
        self.now += seconds
        self.engine.step_took(seconds)
        self.engine.mark_sent(self.now)
        for output in outputs:
            if output.audio.size:
                self.sent.setdefault(output.request_id, []).append(self.now)

    def late_streams(self, lead_s: float) -> set[str]:
        """The streams with a chunk that left after their listener (lead ``lead_s``, playing from the first chunk's
        departure on) needed it."""
        return {
            rid
            for rid, times in self.sent.items()
            if any(sent > times[0] + lead_s + index * CHUNK_S + 1e-9 for index, sent in enumerate(times))
        }


LEAD_S = 0.3


def slowed_engine(make_realtime_engine, make_request, max_step_load: float | None) -> tuple[Engine, Machine]:
    """Three streams running on 16 slots, the machine three times slower for ten steps."""
    engine, _ = make_realtime_engine(COST, config={"max_step_load": max_step_load}, num_slots=16)
    machine = Machine(engine)
    for rid in ("a", "b", "c"):
        engine.add(make_request(rid, "x" * 5, playback_lead_s=LEAD_S))
    machine.slowdown = 3.0
    for _ in range(10):
        machine.step()
    return engine, machine


def test_on_a_slowed_machine_new_streams_are_shed_and_the_live_ones_stay_on_time(make_realtime_engine, make_request):
    engine, machine = slowed_engine(make_realtime_engine, make_request, max_step_load=0.9)
    assert engine.step_cost_ratio == pytest.approx(3.0)
    # Three streams take 3 x 40 = 120 ms a step; a fourth would make 150 ms, over the 144 ms budget. At the
    # start-up fit it would have been 50 ms, and so would nine more.
    for index in range(6):
        with pytest.raises(OverBudgetError, match="144 ms"):
            engine.add(make_request(f"new{index}", "x" * 5, playback_lead_s=LEAD_S))
    assert engine.sessions_shed == 6 and engine.num_waiting == 0
    assert engine.step_load_s == pytest.approx(0.12)
    assert isinstance(OverBudgetError("x"), QueueFullError)  # answered as a full queue is: busy, retry later
    while engine.has_unfinished():
        machine.step()
    assert sorted(machine.sent) == ["a", "b", "c"]
    assert machine.late_streams(LEAD_S) == set()


def test_without_shedding_the_same_arrivals_make_every_stream_late(make_realtime_engine, make_request):
    """What rule 7 prevents: admitted into the slowed batch, nine streams' steps take 300 ms per 160 ms of audio."""
    engine, machine = slowed_engine(make_realtime_engine, make_request, max_step_load=None)
    for index in range(6):
        engine.add(make_request(f"new{index}", "x" * 5, playback_lead_s=LEAD_S))
    while engine.has_unfinished():
        machine.step()
    assert machine.late_streams(LEAD_S) >= {"a", "b", "c"}


def test_the_engine_admits_again_once_the_machine_recovers(make_realtime_engine, make_request):
    engine, machine = slowed_engine(make_realtime_engine, make_request, max_step_load=0.9)
    with pytest.raises(OverBudgetError):
        engine.add(make_request("early", "x" * 5))
    machine.slowdown = 1.0
    for _ in range(5):
        machine.step()
    assert engine.step_cost_ratio == pytest.approx(1.0)
    engine.add(make_request("later", "x" * 5))
    assert engine.num_waiting == 1


def test_a_continuing_sentence_is_never_shed_and_counts_for_the_streams_behind_it(make_realtime_engine, make_request):
    # At the start-up fit 13 streams fit the budget: 12 running, then a continuing sentence takes the 13th place.
    engine, _ = make_realtime_engine(COST, config={"max_step_load": 0.9}, num_slots=16)
    machine = Machine(engine)
    for index in range(12):
        engine.add(make_request(f"s{index}", "x" * 5))
    machine.step()
    engine.add(make_request("next-sentence", "x" * 5, playback_due=machine.now + 1.0))
    engine.add(make_request("more", "x" * 5, playback_due=machine.now + 1.0))  # over budget, but a live stream's
    with pytest.raises(OverBudgetError):
        engine.add(make_request("new", "x" * 5))
    assert engine.num_waiting == 2


def test_a_stream_counts_its_row_weight_times_its_listeners_speed(make_realtime_engine, make_request):
    engine, _ = make_realtime_engine(COST, config={"max_step_load": 0.9}, num_slots=16)
    engine.add(make_request("double-speed", "x" * 5, playback_speed=2.0))
    for index in range(10):
        engine.add(make_request(f"s{index}", "x" * 5))
    assert engine.scheduler.committed_demand() == 12  # 13 fit: one more is taken
    engine.add(make_request("fits", "x" * 5))
    with pytest.raises(OverBudgetError):
        engine.add(make_request("over", "x" * 5))


def test_requests_waiting_for_a_slot_are_not_committed_streams(make_realtime_engine, make_request):
    """A request queued behind full slots replaces a stream that ends: it adds no step load while it waits."""
    engine, _ = make_realtime_engine(COST, config={"max_step_load": 0.9}, num_slots=4)
    for index in range(10):
        engine.add(make_request(f"s{index}", "x" * 5))
    assert engine.num_waiting == 10 and engine.scheduler.committed_demand() == 4
