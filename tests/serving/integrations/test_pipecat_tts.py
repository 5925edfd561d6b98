"""``voxwire.integrations.pipecat.VoxwireTTSService`` in a real Pipecat pipeline (its own test processor and
worker), against the server in process: tokens streamed as an LLM would, a turn end, an interruption."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from pipecat.frames.frames import (
    EndFrame,
    Frame,
    InterruptionFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    TTSAudioRawFrame,
    TTSStoppedFrame,
    TTSTextFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.frame_processor import FrameDirection
from pipecat.tests.utils import QueuedFrameProcessor
from pipecat.workers.runner import WorkerRunner

from voxwire.integrations.pipecat import VoxwireTTSService

from .test_livekit_tts import STEP_S, engine_busy, record_requests, record_steps

pytestmark = pytest.mark.asyncio

TIMEOUT_S = 60.0
RATE = 24000


class Bot:
    """A pipeline [VoxwireTTSService, sink]: ``say`` pushes frames in, ``next_of`` reads what came out."""

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
async def running_bot(server_url: str) -> AsyncIterator[Bot]:
    received: asyncio.Queue[Frame] = asyncio.Queue()
    sink = QueuedFrameProcessor(queue=received, queue_direction=FrameDirection.DOWNSTREAM)
    tts = VoxwireTTSService(server=server_url, seed=1)
    params = PipelineParams(audio_out_sample_rate=RATE)
    worker = PipelineWorker(Pipeline([tts, sink]), params=params, cancel_on_idle_timeout=False)
    started = asyncio.Event()

    @worker.event_handler("on_pipeline_started")
    async def on_started(worker: PipelineWorker, frame: Frame) -> None:
        started.set()

    runner = WorkerRunner()
    await runner.add_workers(worker)
    running = asyncio.create_task(runner.run())
    await asyncio.wait_for(started.wait(), TIMEOUT_S)
    try:
        yield Bot(worker, received)
    finally:
        await worker.queue_frame(EndFrame())
        await asyncio.wait_for(running, TIMEOUT_S)


async def test_tokens_speak_before_the_turn_ends_and_sentences_become_text_frames(
    serve, slow_down, monkeypatch
) -> None:
    server = await serve()
    slow_down(server.app, 0.02)
    requests = record_requests(server.app, monkeypatch)
    async with running_bot(str(server.make_url("/"))) as bot:
        await bot.say(LLMFullResponseStartFrame(), *map(LLMTextFrame, ("The first ", "sentence is ", "here. ", "The")))
        first = await bot.next_of(TTSAudioRawFrame)  # the turn's text is not over yet
        assert first.sample_rate == RATE and first.num_channels == 1
        await bot.say(LLMTextFrame(" second one ends now."), LLMFullResponseEndFrame())
        await bot.next_of(TTSStoppedFrame)
    frames = bot.drain()
    assert requests == [("The first sentence is here.", False), ("The second one ends now.", True)]
    sentences = [frame.text for frame in frames if isinstance(frame, TTSTextFrame)]
    assert sentences == ["The first sentence is here.", "The second one ends now."]
    assert len({frame.context_id for frame in frames if isinstance(frame, TTSAudioRawFrame)}) == 1


async def test_an_interruption_cancels_within_one_step_and_drops_the_late_audio(serve) -> None:
    server = await serve()
    steps = record_steps(server.app, STEP_S)
    async with running_bot(str(server.make_url("/"))) as bot:
        text = "This sentence is long enough to keep speaking for a while. And another one follows it. "
        await bot.say(LLMFullResponseStartFrame(), LLMTextFrame(text))
        await bot.next_of(TTSAudioRawFrame)
        assert engine_busy(server.app)
        await bot.say(InterruptionFrame())
        await bot.next_of(InterruptionFrame)
        interrupted = time.perf_counter()
        while engine_busy(server.app):
            await asyncio.sleep(0.005)
        await asyncio.sleep(3 * STEP_S)  # time for any late frame to show up
        decoding_after = [ids for started, ids in steps if started > interrupted and ids]
        assert len(decoding_after) <= 1, f"{len(decoding_after)} steps still decoded the turn after the interruption"
        after = bot.drain()[bot.seen.index(next(f for f in bot.seen if isinstance(f, InterruptionFrame))) + 1 :]
        assert not [frame for frame in after if isinstance(frame, TTSAudioRawFrame)]

        # the connection goes on: the next turn speaks
        await bot.say(LLMFullResponseStartFrame(), LLMTextFrame("Yes?"), LLMFullResponseEndFrame())
        assert isinstance(await bot.next_of(TTSAudioRawFrame), TTSAudioRawFrame)
        await bot.next_of(TTSStoppedFrame)
