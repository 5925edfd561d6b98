"""Scheduler invariants under randomly interleaved adds, aborts, finishes and runner failures.

``Checked`` wraps an engine and asserts after every step: the batch stays within ``max_running``;
admission is FIFO, within the prefill budget (bar one lone head) and never leaves a slot idle
while someone waits; every running session gets exactly one output per step, arrivals or not;
each chunk is the one that session's step index calls for; no id is mentioned after its final
output. The FakeRunner meanwhile asserts compaction, correct moves and no double allocation.
At the end, nothing may be left: no slot, no session, no runner row or per-request state.

Under the real-time policy (driven in virtual time, each step lasting what the runner's cost model
says) the same holds, except that running sessions ahead of their listener may skip a step: then
every due session still decodes, and no decoded session is further ahead than a skipped one.
"""

from __future__ import annotations

import math
import random
import zlib
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from voxwire.engine import FinishReason, QueueFullError
from voxwire.engine.policy import playback_deadline


def _pseudo(*key: object) -> int:
    return zlib.crc32(repr(key).encode()) % 100


class Checked:
    def __init__(self, engine, runner, chunk_of) -> None:
        self.engine, self.runner, self.chunk_of = engine, runner, chunk_of
        self.realtime = engine.scheduler.realtime
        self.now = 0.0
        self.skips = 0
        self.next_index: Counter[str] = Counter()
        self.finals: Counter[str] = Counter()
        self.accepted: list[str] = []
        self.events = 0

    def add(self, request) -> None:
        try:
            self.engine.add(request)
        except QueueFullError:
            assert self.engine.num_waiting == self.engine.config.max_waiting + self.engine.num_free_slots
            return
        self.accepted.append(request.request_id)
        self.events += 1

    def abort(self, pick: int) -> None:
        live = list(self.engine.scheduler.records)
        if live and self.engine.abort(live[pick % len(live)]):
            self.events += 1

    def step(self) -> None:
        config, scheduler = self.engine.config, self.engine.scheduler
        running = set(scheduler.slots.owners)
        waiting = list(scheduler.waiting)
        free = self.engine.num_free_slots
        blocks = scheduler.blocks
        head_fits = bool(waiting) and blocks.blocks_for(waiting[0].prepared.kv_positions) <= blocks.num_free
        ready = self.engine.next_step_at(self.now)
        if self.realtime is not None and ready < math.inf:  # wait, as a server would, until a step has work
            self.now = max(self.now, ready)
        slack = self._slacks()
        plans_before = len(self.runner.plans)
        outputs = self.engine.step(self.now)
        new_plans = self.runner.plans[plans_before:]
        self._advance_clock(new_plans)
        admitted = [p.request_id for plan in new_plans for p in plan.prefills]
        assert admitted == [r.request_id for r in waiting[: len(admitted)]], "admission is not FIFO"
        if self.realtime is None:
            tokens = [r.prepared.prompt_positions for r in waiting[: len(admitted)]]
            assert len(admitted) == 1 or sum(tokens) <= config.max_prefill_tokens_per_step
        assert len(admitted) <= free and len(running) + len(admitted) <= config.max_running
        assert admitted or not (waiting and free and head_fits), "a slot stayed idle while a request waited"
        assert blocks.num_used == sum(len(s.blocks) for s in scheduler.records.values()), "a KV block leaked"
        ids = [o.request_id for o in outputs]
        assert len(ids) == len(set(ids)), "two outputs for one session in one step"
        assert set(admitted) <= set(ids), "an admitted session got no first chunk in its admitting step"
        if self.realtime is None:
            assert running <= set(ids), "a running session got no output this step"
        else:
            self._check_skips(slack, set(ids))
        for output in outputs:
            self._check_output(output)

    def _slacks(self) -> dict[str, float]:
        if self.realtime is None:
            return {}
        records, lead = self.engine.scheduler.records, self.engine.config.playback_lead_s
        return {
            rid: playback_deadline(records[rid].playback_start(lead), records[rid].step_index, self.realtime.chunk_s)
            - self.now
            for rid in self.engine.scheduler.slots.owners
        }

    def _advance_clock(self, plans) -> None:
        if self.realtime is not None and plans:
            tokens = sum(item.prepared.prompt_positions for item in plans[-1].prefills)
            self.now += self.realtime.cost.seconds(len(plans[-1].decode_slots), tokens)
            self.engine.mark_sent(self.now)

    def _check_skips(self, slack: dict[str, float], served: set[str]) -> None:
        skipped = set(slack) - served
        self.skips += len(skipped)
        due = {rid for rid, s in slack.items() if s <= self.realtime.due_within_s}
        assert not due & skipped, f"due sessions {due & skipped} skipped a step"
        if skipped and served & set(slack):
            assert max(slack[rid] for rid in served & set(slack)) <= min(slack[rid] for rid in skipped)

    def _check_output(self, output) -> None:
        rid = output.request_id
        assert not self.finals[rid], f"{rid} mentioned after its final output"
        if output.finish_reason in (FinishReason.ABORTED, FinishReason.ERROR):
            assert output.audio.size == 0
        else:
            np.testing.assert_array_equal(output.audio, self.chunk_of(rid, self.next_index[rid]))
            self.next_index[rid] += 1
        if output.finished:
            self.finals[rid] += 1
            self.events += 1

    def drain_and_check_nothing_leaks(self) -> None:
        for _ in range(10_000):
            if not self.engine.has_work():
                break
            self.step()
        assert not self.engine.has_work()
        assert self.engine.num_running == self.engine.num_waiting == 0
        assert self.engine.num_free_slots == self.engine.config.max_running
        assert self.engine.kv_blocks_used == 0, "every KV block is back in the pool"
        assert not self.engine.scheduler.records
        assert self.runner.is_empty, f"runner still holds {self.runner.rows} / {self.runner.state}"
        assert sorted(self.finals.elements()) == sorted(self.accepted), "each request ends exactly once"


def _chaotic_engine(make_engine, num_slots: int, budget: int, kv_blocks: int, prompts: dict[str, int]):
    """``kv_blocks``: a small pool makes admission wait for blocks (every request here needs <= 5); ``prompts``: each
    request's prompt positions, by id."""
    return make_engine(
        num_slots=num_slots,
        num_kv_blocks=kv_blocks,
        prompt_positions=lambda r: prompts[r.request_id],
        stop=lambda rid, i: _pseudo("stop", rid, i) < 10,
        prefill_error=lambda r: "no tokens" if _pseudo("prefill", r.request_id) < 5 else None,
        row_error=lambda rid, i: "bad row" if _pseudo("row", rid, i) < 2 else None,
        fail=lambda plan: _pseudo("fail", plan.request_ids, plan.step_indices) < 3,
        config={"max_waiting": 6, "max_prefill_tokens_per_step": budget},
    )


def _chaotic_realtime_engine(
    make_realtime_engine, num_slots: int, budget: int, kv_blocks: int, prompts: dict[str, int]
):
    """The same chaos under the real-time policy; ``budget`` sets how many rows fit a step."""
    cost = f"4ms+{150 / budget:.3f}ms/row+0.5ms/token"
    return make_realtime_engine(
        cost,
        num_slots=num_slots,
        num_kv_blocks=kv_blocks,
        prompt_positions=lambda r: prompts[r.request_id],
        stop=lambda rid, i: _pseudo("stop", rid, i) < 10,
        prefill_error=lambda r: "no tokens" if _pseudo("prefill", r.request_id) < 5 else None,
        row_error=lambda rid, i: "bad row" if _pseudo("row", rid, i) < 2 else None,
        fail=lambda plan: _pseudo("fail", plan.request_ids, plan.step_indices) < 3,
        config={"max_waiting": 6, "max_ahead_s": 0.5},
    )


@pytest.fixture(params=["fifo", "realtime"])
def chaotic_engine(request, make_engine, make_realtime_engine):
    if request.param == "fifo":
        return lambda num_slots, budget, kv_blocks, prompts: _chaotic_engine(
            make_engine, num_slots, budget, kv_blocks, prompts
        )
    # Two more slots: with one, nobody can be skipped for anybody else.
    return lambda num_slots, budget, kv_blocks, prompts: _chaotic_realtime_engine(
        make_realtime_engine, num_slots + 2, budget, kv_blocks, prompts
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_thousand_random_events_leak_nothing(seed, chaotic_engine, make_request, chunk_of):
    rng = random.Random(seed)
    num_slots, budget, kv_blocks = rng.randint(1, 6), rng.randint(1, 60), rng.randint(6, 24)
    prompts: dict[str, int] = {}
    engine, runner = chaotic_engine(num_slots, budget, kv_blocks, prompts)
    checked = Checked(engine, runner, chunk_of)
    serial = 0
    while checked.events < 1000:
        roll = rng.random()
        if roll < 0.4:
            serial += 1
            text = "x" * rng.randint(1, 4)
            lead = rng.choice([0.0, 0.3, 1.0, 2.0])
            prompts[f"r{serial}"] = rng.randint(1, 40)
            checked.add(make_request(f"r{serial}", text, min_len=rng.randint(0, 4), playback_lead_s=lead))
        elif roll < 0.55:
            checked.abort(rng.randrange(1000))
        else:
            checked.step()
    checked.drain_and_check_nothing_leaks()
    assert checked.realtime is None or checked.skips, "no session ever skipped: the real-time rules went untested"


_ops = st.lists(
    st.tuples(st.sampled_from(["add", "abort", "step"]), st.integers(0, 50), st.integers(1, 40)), max_size=80
)


# The fixtures only hand out pure helper functions, so sharing them across examples is safe.
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=_ops, num_slots=st.integers(1, 4), budget=st.integers(1, 50), kv_blocks=st.integers(6, 24))
def test_invariants_hold_for_any_interleaving(
    ops, num_slots, budget, kv_blocks, chaotic_engine, make_request, chunk_of
):
    prompts: dict[str, int] = {}
    engine, runner = chaotic_engine(num_slots, budget, kv_blocks, prompts)
    checked = Checked(engine, runner, chunk_of)
    for serial, (op, pick, tokens) in enumerate(ops):
        if op == "add":
            text, lead = "x" * (pick % 4 + 1), (pick % 4) * 0.4
            prompts[f"r{serial}"] = tokens
            checked.add(make_request(f"r{serial}", text, min_len=pick % 3, playback_lead_s=lead))
        elif op == "abort":
            checked.abort(pick)
        else:
            checked.step()
    checked.drain_and_check_nothing_leaks()
