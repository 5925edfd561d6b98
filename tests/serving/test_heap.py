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
    assert frozen == gc.get_freeze_count() > 0
    # The garbage cycle was collected before the freeze, not kept forever.
    assert garbage_alive() is None
    # The survivor is no longer walked by any collection.
    assert all(obj is not survivor for obj in gc.get_objects())


@pytest.mark.slow
@pytest.mark.parametrize("workers", ["0", "2"])
def test_served_processes_freeze_once_warmed_up(workers: str) -> None:
    with ServerProcess("--model", "sim", "--workers", workers) as server:
        server.wait_ready()
        expected = 1 if workers == "0" else 1 + int(workers)  # the server, or each frontend and the engine
        frozen = "startup objects frozen out of garbage collection"
        assert poll(lambda: server.log.count(frozen) >= expected, 30.0), server.log
        assert server.stop() == 0
