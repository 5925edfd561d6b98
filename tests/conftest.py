"""Shared test configuration: the GPU marker is skipped automatically where CUDA is absent; fixtures that
several test packages use, among them the tiny models, built once per test process."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from voxwire.tts import VoxCPM

# One compute thread per process, set before anything imports torch: the suite gets its parallelism from
# pytest-xdist's workers and the servers it starts, and torch's OpenMP threads, two per process on two shared cores,
# spin-wait for each other (a test taking 2 s on one thread took 78 s on two beside other busy processes). Tests
# that need more threads set them (tests/model/test_batch_invariant.py); PASSIVE keeps those from spinning.
# Subprocesses inherit both; a developer's own values win.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if holds_module_state(item):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: the slow tests first, so the run ends on short ones
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)
    skip_gpu_tests_without_cuda(items)


def holds_module_state(item: pytest.Item) -> bool:
    """Whether ``item`` uses a fixture built once for its module (e.g. a server): a module-scoped fixture, or a
    session-scoped one its own module defines. pytest-xdist (``--dist loadgroup``) then runs the module's tests on
    one worker, so that the fixture is built once, not once on each worker that gets one of them."""
    module = item.nodeid.split("::")[0]
    definitions = item._fixtureinfo.name2fixturedefs.values()  # type: ignore[attr-defined]
    return any(
        fixture.scope == "module" or (fixture.scope == "session" and fixture.baseid == module)
        for chain in definitions
        for fixture in chain
    )


def skip_gpu_tests_without_cuda(items: list[pytest.Item]) -> None:
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def slow_down() -> Callable[[Any, float], None]:
    """``slow_down(app, seconds)``: every engine step of a served app takes at least ``seconds``, still faster
    than real time but slow enough that an utterance is live when a test acts on it."""
    from voxwire.serving.runtime.keys import ENGINES_KEY

    def apply(app: Any, seconds: float) -> None:
        runner = app[ENGINES_KEY].runner
        execute = runner.execute

        def slow_execute(plan: object) -> object:
            time.sleep(seconds)
            return execute(plan)

        runner.execute = slow_execute

    return apply


@pytest.fixture(scope="session")
def tiny_tts(tmp_path_factory: pytest.TempPathFactory) -> VoxCPM:
    """One tiny random voxcpm2 model on CPU, shared by every test of the process that only reads it (a test that
    changes its model, e.g. adapts its layers, makes its own)."""
    import voxwire
    from voxwire.tiny.checkpoint import make_tiny_checkpoint

    return voxwire.load_model(
        make_tiny_checkpoint(tmp_path_factory.mktemp("tiny-model") / "voxcpm2", "voxcpm2"), device="cpu"
    )


@pytest.fixture(autouse=True)
def _tiny_tts_left_unadapted(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that uses the shared ``tiny_tts`` leaves it without personas: a persona bank wraps its layers and keeps
    its last rows' index, and every later test of the process would read another model (a persona test once did,
    and a batch test on the same worker failed: '3 rows cannot follow a persona index of 2 rows')."""
    yield
    if "tiny_tts" in request.fixturenames:
        assert request.getfixturevalue("tiny_tts").personas is None, "this test gave the shared tiny_tts personas"


@pytest.fixture(scope="session")
def persona_tts(tmp_path_factory: pytest.TempPathFactory) -> VoxCPM:
    """A tiny voxcpm2 model of its own for persona tests (personas wrap its layers), float32 like the fixture."""
    import torch

    import voxwire
    from voxwire.tiny.checkpoint import make_tiny_checkpoint

    folder = make_tiny_checkpoint(tmp_path_factory.mktemp("persona-model") / "voxcpm2", "voxcpm2", seed=0)
    return voxwire.load_model(folder, device="cpu", dtype=torch.float32)
