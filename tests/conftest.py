"""Shared test configuration: the GPU marker is skipped automatically where CUDA is absent; fixtures that
several test packages use."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
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
    from voxwire.serving.keys import ENGINES_KEY

    def apply(app: Any, seconds: float) -> None:
        runner = app[ENGINES_KEY].runner
        execute = runner.execute

        def slow_execute(plan: object) -> object:
            time.sleep(seconds)
            return execute(plan)

        runner.execute = slow_execute

    return apply
