"""The progress rule of ``liveness`` on a real ``EngineCore`` (issue 29, item 1): a step made to hang past its
bound is reported as no progress, while the heart thread keeps the process counted alive; a step that returns
clears the verdict. The supervisor ends a child on either verdict alike (``test_liveness``)."""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
from tests.engine_socket import FrontendSocket, running
from tests.server_process import poll

from voxwire.engine import Engine, Request, RunnerOutput, StepPlan, SynthesisParams
from voxwire.serving.config import ServerConfig
from voxwire.serving.workers import ipc
from voxwire.serving.workers.engine_process import EngineCore
from voxwire.serving.workers.liveness import Activity, HangRule, Pulses
from voxwire.sim.model import SimSpeech, speech_clip
from voxwire.sim.runner import SimConfig, SimRunner

BOUND_S = 0.5
"""The engine's stall bound in these tests."""
LIFE_S = 0.5
"""The liveness timeout these tests judge with: the heart beats every 0.25 s."""


class StuckRunner(SimRunner):
    """The simulator, whose steps hang while ``stuck`` is set (a deadlock in a step, released by the test)."""

    def __init__(self, clip: npt.NDArray[np.float32], num_slots: int) -> None:
        super().__init__(clip, num_slots, SimConfig())
        self.stuck = threading.Event()
        self.released = threading.Event()

    def execute(self, plan: StepPlan) -> RunnerOutput:
        while self.stuck.is_set() and plan.request_ids:
            self.released.wait(0.01)
        return super().execute(plan)


@pytest.fixture
def core(tmp_path: Path) -> Iterator[tuple[EngineCore, StuckRunner, Pulses, str]]:
    config = ServerConfig.of(model="sim", max_sessions=2, realtime=False, workers=0)
    model = SimSpeech()
    runner = StuckRunner(speech_clip(model.config.sample_rate), 2)
    pulses = Pulses(multiprocessing.get_context("spawn"), 1)
    pulse = pulses.pulse(0)
    pulse.start_heart()
    endpoint = f"ipc://{tmp_path}/engine-0"
    engine = Engine(runner, config.engine.engine_config())
    core = EngineCore(model, engine, endpoint, None, pulse, max_voice_jobs=1, stall_bound_s=BOUND_S)
    with running(core):
        yield core, runner, pulses, endpoint


def test_a_step_stuck_past_its_bound_is_no_progress_while_the_heart_beats(
    core: tuple[EngineCore, StuckRunner, Pulses, str],
) -> None:
    _, runner, pulses, endpoint = core
    assert poll(lambda: pulses.started(0), timeout=10)
    assert pulses.hang(0, LIFE_S, watched_since=0.0) is None  # idle: it comes round every poll
    runner.stuck.set()
    frontend = FrontendSocket(endpoint)
    frontend.send(ipc.Hello(1))
    frontend.receive(ipc.Welcome)
    frontend.send(ipc.Add(Request("a", "Stuck in its first step.", 8, SynthesisParams(max_len=20))))
    assert poll(lambda: pulses.hang(0, LIFE_S, watched_since=0.0) is not None, timeout=10)
    hang = pulses.hang(0, LIFE_S, watched_since=0.0)
    assert hang is not None
    assert hang.rule is HangRule.NO_PROGRESS  # the heart still beats: not taken for a stopped process
    assert hang.activity is Activity.STEPPING and hang.requests == 1
    assert hang.bound_s == BOUND_S
    assert "made no progress" in hang.describe() and "running an engine step" in hang.describe()
    runner.stuck.clear()
    runner.released.set()
    frontend.receive(ipc.Outputs)
    assert poll(lambda: pulses.hang(0, LIFE_S, watched_since=0.0) is None, timeout=10)
    frontend.close()


def test_silence_counts_only_from_when_the_watcher_ran_again(
    core: tuple[EngineCore, StuckRunner, Pulses, str],
) -> None:
    """A watcher that was itself not scheduled (the whole machine paused) judges nobody until a full timeout
    has passed since it runs again."""
    _, runner, pulses, endpoint = core
    assert poll(lambda: pulses.started(0), timeout=10)
    runner.stuck.set()
    frontend = FrontendSocket(endpoint)
    frontend.send(ipc.Hello(1))
    frontend.receive(ipc.Welcome)
    frontend.send(ipc.Add(Request("a", "Stuck in its first step.", 8, SynthesisParams(max_len=20))))
    assert poll(lambda: pulses.hang(0, LIFE_S, watched_since=0.0) is not None, timeout=10)
    assert pulses.hang(0, LIFE_S, watched_since=time.monotonic()) is None
    runner.stuck.clear()
    runner.released.set()
    frontend.close()
