"""``voxwire.integrations.pipecat.VoxwireTTSService`` in a real Pipecat pipeline (its own test processor and
worker), against the server in process: tokens streamed as an LLM would, a turn end, an interruption, a
``TTSUpdateSettingsFrame`` between turns, and a refused voice."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from pipecat.frames.frames import (
    ErrorFrame,
    Frame,
    InterruptionFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    TTSAudioRawFrame,
    TTSStoppedFrame,
    TTSTextFrame,
    TTSUpdateSettingsFrame,
)
from pipecat.pipeline.worker import PipelineWorker
from pipecat.processors.frame_processor import FrameDirection
from pipecat.tests.utils import QueuedFrameProcessor
from pipecat.utils.errors import ErrorCategory
from tests.serving.helpers import STEP_S, engine_busy, record_steps
from tests.serving.integrations.pipelines import PipelineBot, running_pipeline

from voxwire.integrations.pipecat import VoxwireTTSService
from voxwire.integrations.session import SpeechSettings

from .conftest import (
    CountedServe,
    record_requests,
    save_voice,
    solo_audio,
)

pytestmark = pytest.mark.asyncio

RATE = 24000


def llm_tokens(text: str) -> list[LLMTextFrame]:
    """``text`` word by word, as a language model streams it."""
    return [LLMTextFrame(f"{word} ") for word in text.split(" ")]


class Bot(PipelineBot):
    """A pipeline [VoxwireTTSService, sink], and the errors that reached its start."""

    def __init__(
        self, worker: PipelineWorker, tts: VoxwireTTSService, received: asyncio.Queue[Frame], errors: list[Frame]
    ) -> None:
        super().__init__(worker, received)
        self.tts = tts
        self.errors = errors
        """The frames that reached the pipeline's start going upstream (errors)."""

    async def speak(self, text: str) -> bytes:
        """One turn (its text as LLM tokens); the 16-bit audio of its context."""
        await self.say(LLMFullResponseStartFrame(), *llm_tokens(text), LLMFullResponseEndFrame())
        start = len(self.seen)
        first = await self.next_of(TTSAudioRawFrame)
        while (await self.next_of(TTSStoppedFrame)).context_id != first.context_id:
            pass
        turn = self.seen[start:]
        return b"".join(f.audio for f in turn if isinstance(f, TTSAudioRawFrame) and f.context_id == first.context_id)


class ErrorSink(QueuedFrameProcessor):
    def __init__(self, errors: list[Frame]) -> None:
        super().__init__(queue=asyncio.Queue(), queue_direction=FrameDirection.UPSTREAM)
        self.errors = errors

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        if direction is FrameDirection.UPSTREAM and isinstance(frame, ErrorFrame):
            self.errors.append(frame)
        await super().process_frame(frame, direction)


@asynccontextmanager
async def running_bot(server_url: str, settings: VoxwireTTSService.Settings | None = None) -> AsyncIterator[Bot]:
    received: asyncio.Queue[Frame] = asyncio.Queue()
    errors: list[Frame] = []
    sink = QueuedFrameProcessor(queue=received, queue_direction=FrameDirection.DOWNSTREAM)
    tts = VoxwireTTSService(url=server_url, settings=settings or VoxwireTTSService.Settings(seed=1))
    async with running_pipeline([ErrorSink(errors), tts, sink], RATE) as worker:
        yield Bot(worker, tts, received, errors)


async def test_tokens_speak_before_the_turn_ends_and_words_become_text_frames(serve, slow_down, monkeypatch) -> None:
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
    words = [frame for frame in frames if isinstance(frame, TTSTextFrame)]
    spoken = "The first sentence is here. The second one ends now."
    assert [frame.text for frame in words] == spoken.split()
    times = [frame.pts for frame in words]
    assert times == sorted(times) and len(set(times)) == len(times), "each word has its own time"
    assert len({frame.context_id for frame in frames if isinstance(frame, TTSAudioRawFrame)}) == 1


async def test_an_interruption_cancels_within_one_step_and_drops_the_late_audio(serve) -> None:
    server = await serve()
    steps = record_steps(server.app, STEP_S)
    async with running_bot(str(server.make_url("/"))) as bot:
        first_sentence = "This sentence is long enough to keep speaking for quite a while, word after word after word."
        await bot.say(LLMFullResponseStartFrame(), LLMTextFrame(f"{first_sentence} And another one follows it. "))
        await bot.next_of(TTSTextFrame)  # the barge-in comes once some words were played
        assert engine_busy(server.app)
        await bot.say(InterruptionFrame())
        await bot.next_of(InterruptionFrame)
        interrupted = time.perf_counter()
        while engine_busy(server.app):
            await asyncio.sleep(0.005)
        await asyncio.sleep(3 * STEP_S)  # time for any late frame to show up
        decoding_after = [ids for started, ids in steps if started > interrupted and ids]
        assert len(decoding_after) <= 1, f"{len(decoding_after)} steps still decoded the turn after the interruption"
        interruption = bot.seen.index(next(f for f in bot.seen if isinstance(f, InterruptionFrame)))
        before, after = bot.seen[:interruption], bot.drain()[interruption + 1 :]
        assert not [frame for frame in after if isinstance(frame, (TTSAudioRawFrame, TTSTextFrame))]
        # What the bot said is the sentence's first words, up to the interruption: not all of it, not none.
        said = [frame.text for frame in before if isinstance(frame, TTSTextFrame)]
        words = first_sentence.split()
        assert 0 < len(said) < len(words) and said == words[: len(said)]

        # the connection goes on: the next turn speaks
        await bot.say(LLMFullResponseStartFrame(), LLMTextFrame("Yes?"), LLMFullResponseEndFrame())
        assert isinstance(await bot.next_of(TTSAudioRawFrame), TTSAudioRawFrame)
        await bot.next_of(TTSStoppedFrame)


async def test_a_settings_update_changes_the_voice_of_the_next_utterance(counted_serve: CountedServe) -> None:
    server, upgrades = await counted_serve()
    voice = await save_voice(server)
    async with running_bot(str(server.make_url("/"))) as bot:
        first = await bot.speak("Hello there.")
        await bot.say(TTSUpdateSettingsFrame(delta=VoxwireTTSService.Settings(voice=voice)))
        second = await bot.speak("Hello there.")
    assert not bot.errors
    assert first == await solo_audio(server, SpeechSettings(seed=1), "Hello there.", RATE)
    assert second == await solo_audio(server, SpeechSettings(voice=voice, seed=1), "Hello there.", RATE)
    assert second != first
    assert len(upgrades) == 1 + 2, "one connection for the pipeline (and one for each reference)"


@pytest.mark.slow
async def test_an_unknown_voice_is_one_permanent_error_and_no_reconnect_storm(counted_serve: CountedServe) -> None:
    server, upgrades = await counted_serve()
    settings = VoxwireTTSService.Settings(voice="voice_does_not_exist")
    async with running_bot(str(server.make_url("/")), settings) as bot:
        for _ in range(2):  # two turns of many tokens each
            text = "Every token of this turn would have been a new connection and two errors."
            await bot.say(LLMFullResponseStartFrame(), *llm_tokens(text), LLMFullResponseEndFrame())
        await asyncio.sleep(1.0)  # time for any retry to show up
        assert not bot.tts.is_usable  # Pipecat gives it no more work, and stops reconnecting
    (error,) = bot.errors
    assert "unknown_voice" in error.error and error.category is ErrorCategory.INVALID_REQUEST
    assert error.category.is_permanent
    assert len(upgrades) == 1
    assert not [f for f in bot.drain() if isinstance(f, TTSAudioRawFrame) and f.context_id is not None]


async def test_an_unknown_voice_set_mid_session_is_one_error_and_a_later_update_recovers(
    counted_serve: CountedServe,
) -> None:
    server, upgrades = await counted_serve()
    async with running_bot(str(server.make_url("/"))) as bot:
        await bot.say(TTSUpdateSettingsFrame(delta=VoxwireTTSService.Settings(voice="voice_does_not_exist")))
        text = "Each of these tokens is refused once at most."
        await bot.say(LLMFullResponseStartFrame(), *llm_tokens(text), LLMFullResponseEndFrame())
        while not bot.errors:
            await asyncio.sleep(0.01)
        assert not bot.tts.is_usable
        await bot.say(TTSUpdateSettingsFrame(delta=VoxwireTTSService.Settings(voice="default")))
        audio = await bot.speak("Hello there.")
    (error,) = bot.errors
    assert "unknown_voice" in error.error and error.category is ErrorCategory.INVALID_REQUEST
    assert len(upgrades) == 1, "the refused start left the connection open"
    assert audio == await solo_audio(server, SpeechSettings(voice="default", seed=1), "Hello there.", RATE)
