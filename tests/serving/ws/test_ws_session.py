"""The ``Session`` state machine without a socket: a memory transport and ``ClipService`` (a clip played in
model-sized steps) make backpressure, cancellation and the continuation rule deterministic."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from voxwire.prompt import VoicePrompt
from voxwire.protocol.wire import (
    AudioFrame,
    Cancel,
    CloseCode,
    Done,
    End,
    Ready,
    Segment,
    Start,
    Text,
    Words,
    encode,
)
from voxwire.serving.ws.session_core import SessionPhase
from voxwire.serving.ws.utterance import continuation

from .conftest import ClipService, until
from .helpers import PATCH, RATE, MemoryTransport, new_session, noise

pytestmark = pytest.mark.asyncio


async def test_a_client_that_does_not_read_is_closed_before_the_backlog_passes_the_bound() -> None:
    service = ClipService(noise(60), RATE, PATCH)
    transport = MemoryTransport(reading=False)
    async with new_session(service, transport, max_unsent_audio_s=1.0) as session:
        session.receive(encode(Text("Speak for ten seconds.")))
        await until(lambda: transport.closed is not None)
        assert transport.closed is not None
        code, reason = transport.closed
        assert code == CloseCode.SLOW_CONSUMER and reason.startswith("slow_consumer")
        assert session.outbox.peak_unsent_s <= 1.0
        assert session.core.phase is SessionPhase.CLOSED and session.server.live_utterances == 0
    assert service.aborted == ["ws-1"], "the engine request must be aborted, not left running"
    assert service.chunks_sent <= 1.0 / (PATCH / RATE) + 1


async def test_cancel_stops_the_stream_within_one_step_and_drops_unsent_audio() -> None:
    service = ClipService(noise(40), RATE, PATCH, step_s=0.02)
    transport = MemoryTransport()
    async with new_session(service, transport) as session:
        session.receive(encode(Start(format="pcm_f32le")))
        session.receive(encode(Text("A long sentence that will not finish.")))
        await until(lambda: len(transport.of(AudioFrame)) >= 2)
        transport.gate.clear()  # the socket stalls: what the engine makes next stays in the outbox
        await until(lambda: session.outbox.unsent_s >= 3 * PATCH / RATE)  # one frame being written, two queued
        produced = service.chunks_sent
        session.receive(encode(Cancel()))
        assert session.outbox.unsent_s == pytest.approx(PATCH / RATE)  # only the frame the socket is taking
        transport.gate.set()
        await until(lambda: bool(transport.of(Done)))
        await asyncio.sleep(5 * service.step_s)
    assert service.chunks_sent == produced and service.aborted == ["ws-1"]
    done = transport.of(Done)[0]
    heard = b"".join(frame.packets[0] for frame in transport.of(AudioFrame))
    assert done.finish_reason == "cancelled" and done.audio_s == len(heard) // 4 / RATE
    assert transport.sent[-1] == done, "nothing of a cancelled utterance follows its done"


async def test_audio_waiting_for_the_socket_leaves_as_one_frame() -> None:
    clip = noise(6)
    service = ClipService(clip, RATE, PATCH)
    transport = MemoryTransport(reading=False)
    async with new_session(service, transport) as session:
        session.receive(encode(Text("Patches.")))  # one word: its timing waits for the sentence's end
        session.receive(encode(End()))
        await until(lambda: session.outbox.unsent_s >= 6 * PATCH / RATE)
        transport.gate.set()
        await until(lambda: bool(transport.of(Done)))
    # The sentence's six waiting patches leave as one frame, its words after them; the encoder's lookahead, flushed
    # when the utterance ends (after the words were queued), follows in a frame of its own.
    assert [type(item) for item in transport.sent] == [Ready, Segment, AudioFrame, Words, AudioFrame, Done]
    frames = transport.of(AudioFrame)
    # 8 Opus packets a patch
    assert [(frame.sequence, len(frame.packets)) for frame in frames] == [(0, 6 * 8), (1, 1)]


async def test_each_sentence_is_prompted_with_the_previous_one_only() -> None:
    service = ClipService(noise(3), RATE, PATCH)
    transport = MemoryTransport()
    async with new_session(service, transport) as session:
        session.receive(encode(Start(seed=10)))
        session.receive(encode(Text("One is here. Two is here. Three is here.")))
        session.receive(encode(End()))
        await until(lambda: bool(transport.of(Done)))
    texts = [text for text, _, _ in service.requests]
    seeds = [params.seed for _, params, _ in service.requests]
    prompts = [voice for _, _, voice in service.requests]
    assert (texts, seeds) == (["One is here.", "Two is here.", "Three is here."], [10, 11, 12])
    assert prompts[0] is None
    carried = [(prompt.text, tuple(prompt.audio_patches.shape)) for prompt in prompts[1:]]
    assert carried == [("One is here. ", (3, 2, 4)), ("Two is here. ", (3, 2, 4))]
    assert [s.start_sample for s in transport.of(Segment)] == [0, 3 * PATCH, 6 * PATCH]


@pytest.mark.isa
@pytest.mark.filterwarnings("ignore:The test <Function")  # a plain function among the module's async tests
def test_a_saved_voice_is_kept_ahead_of_the_carried_sentence() -> None:
    base = VoicePrompt("Clip words.", torch.zeros(5, 2, 4))
    voice = continuation(base, "Spoken.", [np.ones((2, 4), np.float32)] * 3)
    assert voice.text == "Clip words.Spoken. " and voice.audio_patches.shape == (8, 2, 4)
    assert voice.audio_patches.dtype == np.float32 and np.array_equal(voice.audio_patches[5:], np.ones((3, 2, 4)))
