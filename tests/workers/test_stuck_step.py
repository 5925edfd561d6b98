"""The progress rule of ``liveness`` on a real ``EngineCore`` (issue 29, item 1): a step made to hang past its
bound is reported as no progress, while the heart thread keeps the process counted alive; a step that returns
clears the verdict. The supervisor ends a child on either verdict alike (``test_liveness``)."""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
from tests.engine_socket import FrontendSocket, running
from tests.server_process import poll

from voxwire.engine import Engine, Request, RunnerOutput, StepPlan, SynthesisParams
from voxwire.serving.server_config import ServerConfig
from voxwire.serving.workers import ipc
from voxwire.serving.workers.engine_process import EngineCore
from voxwire.serving.workers.liveness import Activity, Hang, HangRule, Pulses
from voxwire.sim.model import SimSpeech, speech_clip
from voxwire.sim.runner import SimConfig, SimRunner

BOUND_S = 0.5
"""The engine's stall bound in these tests."""
LIFE_S = 0.5
"""The liveness timeout these tests judge with: the heart beats every 0.25 s."""


class StuckRunner(SimRunner):
    """The simulator, whose steps with rows hang while ``free`` is clear (a deadlock in a step, ended by the
    test)."""

    def __init__(self, clip: npt.NDArray[np.float32], num_slots: int) -> None:
        super().__init__(clip, num_slots, SimConfig())
        self.free = threading.Event()
        self.free.set()

    def execute(self, plan: StepPlan) -> RunnerOutput:
        if plan.request_ids:
            self.free.wait()
        return super().execute(plan)


@dataclass
class Core:
    """An ``EngineCore`` serving ``endpoint`` from a thread, its runner, and the supervisor's view of its slot."""

    runner: StuckRunner
    pulses: Pulses
    endpoint: str

    def hang(self, watched_since: float = 0.0) -> Hang | None:
        return self.pulses.hang(0, LIFE_S, watched_since)

    def stick_a_step(self) -> FrontendSocket:
        """Send one request whose first step hangs; return once the supervisor's view calls the engine hung."""
        assert poll(lambda: self.pulses.started(0), timeout=10)
        assert self.hang() is None  # idle: its loop comes round every poll
        self.runner.free.clear()
        frontend = FrontendSocket(self.endpoint)
        frontend.send(ipc.Hello(1))
        frontend.receive(ipc.Welcome)
        frontend.send(ipc.Add(Request("a", "Stuck in its first step.", SynthesisParams(max_len=20))))
        assert poll(lambda: self.hang() is not None, timeout=10)
        return frontend


@pytest.fixture
def core(tmp_path: Path) -> Iterator[Core]:
    config = ServerConfig.of(model="sim", max_sessions=2, realtime=False, workers=0)
    model = SimSpeech()
    runner = StuckRunner(speech_clip(model.config.sample_rate), 2)
    pulses = Pulses(multiprocessing.get_context("spawn"), 1)
    pulse = pulses.pulse(0)
    pulse.start_heart()
    endpoint = f"ipc://{tmp_path}/engine-0"
    engine = Engine(runner, config.engine.engine_config())
    engine_core = EngineCore(model, engine, endpoint, None, pulse, max_voice_jobs=1, stall_bound_s=BOUND_S)
    with running(engine_core):
        try:
            yield Core(runner, pulses, endpoint)
        finally:
            runner.free.set()  # a failed test leaves no step hanging for the core's stop to wait on


def test_a_step_stuck_past_its_bound_is_no_progress_while_the_heart_beats(core: Core) -> None:
    frontend = core.stick_a_step()
    hang = core.hang()
    assert hang is not None
    assert hang.rule is HangRule.NO_PROGRESS  # the heart still beats: not taken for a stopped process
    assert hang.activity is Activity.STEPPING and hang.requests == 1
    assert hang.bound_s == BOUND_S
    assert "made no progress" in hang.describe() and "running an engine step" in hang.describe()
    core.runner.free.set()
    frontend.receive(ipc.Outputs)
    assert poll(lambda: core.hang() is None, timeout=10)
    frontend.close()


def test_silence_counts_only_from_when_the_watcher_ran_again(core: Core) -> None:
    """A watcher that was itself not scheduled (the whole machine paused) judges nobody until a full timeout
    has passed since it runs again."""
    frontend = core.stick_a_step()
    assert core.hang(watched_since=time.monotonic()) is None
    frontend.close()
