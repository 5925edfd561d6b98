"""The admission rule and the scheduler's queue discipline, without a runner."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from voxwire.engine import DuplicateRequestError, EngineConfig, Prepared, QueueFullError
from voxwire.engine.blocks import BlockAllocator
from voxwire.engine.policy import admit_count
from voxwire.engine.scheduler import Scheduler


@pytest.mark.parametrize(
    ("tokens", "free", "budget", "expected"),
    [
        pytest.param([10, 10, 10], 8, 25, 2, id="budget stops the third"),
        pytest.param([10, 10, 10], 1, 100, 1, id="slots stop the second"),
        pytest.param([900, 1], 8, 100, 1, id="an over-budget head is admitted alone"),
        pytest.param([10, 900, 1], 8, 100, 1, id="no overtaking the one that does not fit"),
        pytest.param([5, 5], 0, 100, 0, id="no free slot"),
        pytest.param([], 8, 100, 0, id="empty queue"),
    ],
)
def test_admit_count(tokens, free, budget, expected):
    assert admit_count(tokens, free, budget) == expected


@given(st.lists(st.integers(1, 300), max_size=20), st.integers(0, 10), st.integers(1, 500))
def test_admit_count_invariants(tokens, free, budget):
    n = admit_count(tokens, free, budget)
    assert n <= min(free, len(tokens))
    assert n == 1 or sum(tokens[:n]) <= budget  # only a lone head may exceed the budget
    if free and tokens:
        assert n >= 1  # a free slot is never left idle while someone waits
    if n < min(free, len(tokens)):
        assert sum(tokens[: n + 1]) > budget  # stopped only because the next one does not fit


SMALL = Prepared(prompt_positions=10, kv_positions=20)
"""A request of a few positions, as a runner prepared it."""


def _scheduler(**config) -> Scheduler:
    return Scheduler(EngineConfig(**{"max_running": 2, "max_waiting": 3, **config}), BlockAllocator(1 << 16, 16))


def test_queue_full_rejects_with_a_clear_error(make_request):
    scheduler = _scheduler()
    scheduler.add(make_request("r0"), SMALL)
    scheduler.add(make_request("r1"), SMALL)
    scheduler.schedule()  # both slots taken
    for i in range(2, 5):
        scheduler.add(make_request(f"r{i}"), SMALL)
    with pytest.raises(QueueFullError, match=r"'r5' rejected: the waiting queue is full \(3 requests waiting"):
        scheduler.add(make_request("r5"), SMALL)


def test_free_slots_are_handed_out_before_the_queue_is_judged(make_request):
    """Requests arriving between two steps are not refused while slots are free (probe defect D8)."""
    scheduler = _scheduler(max_running=4, max_waiting=1)
    for i in range(5):  # four will take the free slots at the next step, one waits
        scheduler.add(make_request(f"r{i}"), SMALL)
    with pytest.raises(QueueFullError):
        scheduler.add(make_request("r5"), SMALL)
    assert len(scheduler.schedule().prefills) == 4


def test_running_requests_do_not_count_against_the_queue(make_request):
    scheduler = _scheduler()
    for i in range(3):
        scheduler.add(make_request(f"r{i}"), SMALL)
    scheduler.schedule()  # admits r0 and r1
    scheduler.add(make_request("r3"), SMALL)
    scheduler.add(make_request("r4"), SMALL)
    assert [s.request_id for s in scheduler.waiting] == ["r2", "r3", "r4"]


def test_duplicate_ids_are_rejected_until_the_final_output(make_request):
    scheduler = _scheduler()
    scheduler.add(make_request("a"), SMALL)
    with pytest.raises(DuplicateRequestError, match="'a'"):
        scheduler.add(make_request("a"), SMALL)
    scheduler.schedule()
    assert scheduler.abort("a")
    with pytest.raises(DuplicateRequestError):
        scheduler.add(make_request("a"), SMALL)  # its aborted output is still owed
    assert [s.request_id for s in scheduler.take_aborted()] == ["a"]
    scheduler.add(make_request("a"), SMALL)


def test_abort_of_a_waiting_request_keeps_fifo_order_of_the_rest(make_request):
    scheduler = _scheduler(max_running=1)
    for rid in "abc":
        scheduler.add(make_request(rid), SMALL)
    assert scheduler.abort("b")
    assert not scheduler.abort("b") and not scheduler.abort("zzz")
    assert [item.request_id for item in scheduler.schedule().prefills] == ["a"]
    assert [s.request_id for s in scheduler.waiting] == ["c"]


def test_plan_describes_releases_moves_and_prefills(make_request):
    scheduler = _scheduler(max_running=3, max_prefill_tokens_per_step=100)
    for rid in "abc":
        scheduler.add(make_request(rid), SMALL)
    first = scheduler.schedule()
    assert [(p.request_id, p.slot) for p in first.prefills] == [("a", 0), ("b", 1), ("c", 2)]
    assert first.request_ids == ("a", "b", "c") and first.step_indices == (0, 0, 0)
    scheduler.abort("a")
    scheduler.add(make_request("d"), SMALL)
    second = scheduler.schedule()
    assert second.released == ("a",)
    assert [(m.src, m.dst) for m in second.moves] == [(2, 0)]
    assert [(p.request_id, p.slot) for p in second.prefills] == [("d", 2)]
    assert second.request_ids == ("c", "b", "d")
