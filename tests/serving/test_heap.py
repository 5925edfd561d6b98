"""A warmed-up serving process takes its startup heap out of garbage collection (``serving/runtime/heap.py``)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest
from tests.server_process import ServerProcess, poll

from voxwire.serving.runtime.heap import freeze_startup_heap


@pytest.fixture
def unfrozen() -> Iterator[None]:
    """The test process must not keep its heap frozen: later tests' garbage would never be collected."""
    gc.unfreeze()
    yield
    gc.unfreeze()


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_freezing_exempts_survivors_and_collects_garbage_first(unfrozen: None) -> None:
    survivor = _Cycle()
    garbage = _Cycle()
    garbage_alive = weakref.ref(garbage)
    del garbage
    frozen = freeze_startup_heap("test")
    # At most what was frozen is still frozen: a frozen object freed since, in this thread or in another (under
    # xdist the worker's receiver thread wakes whenever more tests arrive), has left the permanent generation.
    assert frozen >= gc.get_freeze_count() > 0
    # The garbage cycle was collected before the freeze, not kept forever.
    assert garbage_alive() is None
    # The survivor is no longer walked by any collection.
    assert all(obj is not survivor for obj in gc.get_objects())


class _Leaf:
    """An object without a reference cycle: reference counting alone frees it."""


def test_a_frozen_object_is_still_freed_when_its_last_reference_goes(unfrozen: None) -> None:
    # So a freeze keeps nothing alive, and the freeze count shrinks after it (the test above).
    doomed = [_Leaf() for _ in range(1000)]
    alive = [weakref.ref(leaf) for leaf in doomed]
    frozen = freeze_startup_heap("test")
    del doomed
    assert all(ref() is None for ref in alive)
    assert gc.get_freeze_count() <= frozen - len(alive)  # the leaves (and their list) left the permanent generation


@pytest.mark.slow
@pytest.mark.parametrize("workers", ["0", "2"])
def test_served_processes_freeze_once_warmed_up(workers: str) -> None:
    with ServerProcess("--model", "sim", "--workers", workers) as server:
        server.wait_ready()
        expected = 1 if workers == "0" else 1 + int(workers)  # the server, or each frontend and the engine
        frozen = "startup objects frozen out of garbage collection"
        assert poll(lambda: server.log.count(frozen) >= expected, 30.0), server.log
        assert server.stop() == 0
