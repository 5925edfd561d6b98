"""``--workers 0``: the engine thread's death or hang never leaves a server that takes connections and never
answers (issue 29, item 2). A dead thread is replaced by a new engine over the loaded model, its stream ending
with ``engine_restarted``; a crash loop, or a step stuck past its bound, stops the server with status 1."""

from __future__ import annotations

import asyncio
import logging
import threading

import numpy as np
import numpy.typing as npt
import pytest

from voxwire.engine import RunnerOptions, StepPlan, SynthesisParams
from voxwire.engine.outputs import RunnerOutput
from voxwire.finish_reason import FinishReason
from voxwire.protocol.error_codes import ErrorCode
from voxwire.serving.app import make_app, run_app
from voxwire.serving.runtime.keys import SPEAKER_KEY, STATE_KEY
from voxwire.serving.server_config import ServerConfig
from voxwire.serving.speech.service import SpeechFailure, SpeechJob, SpeechService
from voxwire.sim.model import SimSpeech, speech_clip
from voxwire.sim.runner import SimConfig, SimRunner


class _EngineBug(BaseException):
    """Escapes the engine's guard around the runner, as a bug in the engine itself would: the thread dies."""


class FaultyRunner(SimRunner):
    """The simulator, whose next step can be made to kill the engine thread (``fail_next``) or to hang while
    ``free`` is clear."""

    def __init__(self, clip: npt.NDArray[np.float32], num_slots: int, config: SimConfig) -> None:
        super().__init__(clip, num_slots, config)
        self.fail_next = 0
        self.free = threading.Event()
        self.free.set()

    def execute(self, plan: StepPlan) -> RunnerOutput:
        if self.fail_next and plan.request_ids:
            self.fail_next -= 1
            raise _EngineBug("an injected engine bug")
        if plan.request_ids:
            self.free.wait()
        return super().execute(plan)


class FaultySim(SimSpeech):
    runner: FaultyRunner

    def new_runner(self, options: RunnerOptions) -> FaultyRunner:
        self.runner = FaultyRunner(speech_clip(self.config.sample_rate), options.num_slots, self.config)
        return self.runner


def config(**settings: object) -> ServerConfig:
    return ServerConfig.of(model="sim", port=0, workers=0, max_sessions=2, realtime=False, **settings)


async def speak(service: SpeechService, seed: int) -> FinishReason | None:
    job = SpeechJob(service.new_request_id(), "A short sentence.", SynthesisParams(seed=seed, max_len=4))
    finish = None
    async for chunk in service.speak(job):
        finish = chunk.finish_reason
    return finish


async def wait_for(condition: object, timeout: float = 30.0) -> None:
    async def poll() -> None:
        while not condition():  # type: ignore[operator]
            await asyncio.sleep(0.02)

    await asyncio.wait_for(poll(), timeout)


@pytest.mark.asyncio
async def test_a_dead_engine_thread_is_replaced_and_its_stream_ends_with_engine_restarted() -> None:
    model = FaultySim()
    service = SpeechService(model, config())
    fatal: list[str] = []
    service.on_fatal = fatal.append
    await service.start()
    try:
        dead = service.engine
        model.runner.fail_next = 1
        with pytest.raises(SpeechFailure) as failure:
            await speak(service, seed=1)
        assert failure.value.code is ErrorCode.ENGINE_RESTARTED
        await wait_for(lambda: service.engine is not dead and service.available)
        assert await speak(service, seed=2) in (FinishReason.STOP, FinishReason.LENGTH)
        assert fatal == []
    finally:
        await service.stop()


@pytest.mark.asyncio
async def test_engine_thread_deaths_in_a_crash_loop_are_fatal() -> None:
    model = FaultySim()
    service = SpeechService(model, config(crash_loop_deaths=2))
    fatal: list[str] = []
    service.on_fatal = fatal.append
    await service.start()
    try:
        for seed in range(2):
            engine = service.engine
            model.runner.fail_next = 1
            with pytest.raises(SpeechFailure):
                await speak(service, seed=seed)
            await wait_for(lambda: service.engine is not engine or bool(fatal))  # noqa: B023
        assert len(fatal) == 1 and "2 engine deaths within 600 s, a crash loop" in fatal[0]
    finally:
        await service.stop()


def test_a_stuck_engine_thread_fails_its_streams_and_stops_the_server_with_status_1(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = FaultySim()
    settings = config(stall_timeout_s=0.5, stall_factor=1.0, drain_timeout_s=5.0)
    app = make_app(settings, model=model)

    async def main() -> tuple[int, ErrorCode]:
        server = asyncio.create_task(run_app(app, settings))
        await wait_for(lambda: app[STATE_KEY].accepting)
        model.runner.free.clear()
        with pytest.raises(SpeechFailure) as failure:
            await speak(app[SPEAKER_KEY], seed=1)  # type: ignore[arg-type]
        return await asyncio.wait_for(server, 30), failure.value.code

    try:
        with caplog.at_level(logging.ERROR):
            status, code = asyncio.run(main())
    finally:
        model.runner.free.set()
    assert status == 1
    assert code is ErrorCode.UNAVAILABLE
    assert any("the engine thread made no progress" in record.getMessage() for record in caplog.records)
