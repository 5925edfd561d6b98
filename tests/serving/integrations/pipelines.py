"""A Pipecat pipeline around a TTS service, run by Pipecat's own worker, for the tests of our Pipecat service and of
Pipecat's ElevenLabs service against our endpoint."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from pipecat.frames.frames import EndFrame, Frame
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.workers.runner import WorkerRunner

from .conftest import TIMEOUT_S


class PipelineBot:
    """A pipeline [a TTS service, sink]: ``say`` pushes frames in, ``next_of`` reads what came out."""

    def __init__(self, worker: PipelineWorker, received: asyncio.Queue[Frame]) -> None:
        self.worker = worker
        self.received = received
        self.seen: list[Frame] = []

    async def say(self, *frames: Frame) -> None:
        for frame in frames:
            await self.worker.queue_frame(frame, FrameDirection.DOWNSTREAM)

    async def next_of(self, kind: type) -> Frame:
        while True:
            frame = await asyncio.wait_for(self.received.get(), TIMEOUT_S)
            self.seen.append(frame)
            if isinstance(frame, kind):
                return frame

    def drain(self) -> list[Frame]:
        while not self.received.empty():
            self.seen.append(self.received.get_nowait())
        return self.seen


@asynccontextmanager
async def running_pipeline(processors: list[FrameProcessor], rate: int) -> AsyncIterator[PipelineWorker]:
    """``processors`` as a started pipeline at output ``rate``; ended (``EndFrame``) when the block ends."""
    worker = PipelineWorker(
        Pipeline(processors), params=PipelineParams(audio_out_sample_rate=rate), cancel_on_idle_timeout=False
    )
    started = asyncio.Event()

    @worker.event_handler("on_pipeline_started")
    async def on_started(worker: PipelineWorker, frame: Frame) -> None:
        started.set()

    runner = WorkerRunner()
    await runner.add_workers(worker)
    running = asyncio.create_task(runner.run())
    await asyncio.wait_for(started.wait(), TIMEOUT_S)
    try:
        yield worker
    finally:
        await worker.queue_frame(EndFrame())
        await asyncio.wait_for(running, TIMEOUT_S)
