"""Streaming text in: sentences speak before ``end``, ``flush`` and the buffer delay release the rest, ``cancel``
stops mid-stream, several utterances share a socket, and consecutive sentences continue one voice."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import numpy as np
import pytest
import torch

from voxwire.engine import SynthesisParams
from voxwire.prompt import VoicePrompt
from voxwire.protocol.wire import AudioFrame, Cancel, Done, End, Flush, Ready, Segment, Start, Text
from voxwire.serving.runtime.keys import SPEAKER_KEY, STATE_KEY
from voxwire.serving.speech.service import SpeechJob
from voxwire.tts import VoxCPM

from .conftest import Connect, StreamClient, engine_idle

pytestmark = pytest.mark.asyncio

MANY_SENTENCES = " ".join(f"Sentence number {n} is here." for n in range(1, 9))


async def configure(stream: StreamClient, **settings: object) -> Ready:
    await stream.send(Start(**settings))  # type: ignore[arg-type]
    return await stream.expect(Ready)


async def test_a_complete_sentence_speaks_before_the_utterance_ends(ws_server: Callable, connect: Connect) -> None:
    stream = await connect(await ws_server())
    await configure(stream, max_buffer_delay_ms=60_000)
    await stream.send(Text("The first sentence is complete. The second"))
    segment = await stream.expect(Segment)
    assert (segment.index, segment.text, segment.start_sample) == (0, "The first sentence is complete.", 0)
    assert isinstance(await stream.receive(), AudioFrame)

    await stream.send(Text(" is not, until now."))
    await stream.send(End())
    heard = await stream.heard()
    assert [s.text for s in heard.segments] == ["The second is not, until now."]
    assert heard.done is not None and heard.done.segments == 2


async def test_flush_speaks_an_incomplete_sentence_now(ws_server: Callable, connect: Connect) -> None:
    stream = await connect(await ws_server())
    await configure(stream, max_buffer_delay_ms=60_000)
    await stream.send(Text("No full stop yet"))
    with pytest.raises(asyncio.TimeoutError):
        await stream.receive(timeout=0.5)
    await stream.send(Flush())
    assert (await stream.expect(Segment)).text == "No full stop yet"
    await stream.send(End())
    heard = await stream.heard()
    assert heard.done is not None and heard.done.segments == 1


@pytest.mark.parametrize("delay_ms", [0, 300])
async def test_an_incomplete_sentence_waits_at_most_the_buffer_delay(
    ws_server: Callable, connect: Connect, delay_ms: int
) -> None:
    stream = await connect(await ws_server())
    await configure(stream, max_buffer_delay_ms=delay_ms)
    await stream.send(Text("Waiting for more words"))
    assert (await stream.expect(Segment)).text == "Waiting for more words"
    await stream.send(End())
    heard = await stream.heard()
    assert heard.done is not None and heard.done.buffer_s is not None
    assert delay_ms / 1000 <= heard.done.buffer_s < delay_ms / 1000 + 0.25


async def test_cancel_stops_mid_stream_frees_the_engine_and_the_socket_goes_on(
    ws_server: Callable, connect: Connect
) -> None:
    server = await ws_server()
    stream = await connect(server)
    await configure(stream, format="pcm_f32le", seed=1)
    await stream.send(Text(MANY_SENTENCES))
    first = await stream.expect(Segment)
    heard_before = [await stream.expect(AudioFrame)]
    await stream.send(Cancel())
    cancelled_at = time.monotonic()
    rest = await stream.heard()
    latency = time.monotonic() - cancelled_at
    done = rest.done
    assert done is not None and done.finish_reason == "cancelled" and done.utterance == 0
    assert latency < 2.0, f"done came {latency:.2f} s after cancel"
    assert len([first, *rest.segments]) < 8
    # done.audio_s is exactly what reached the client, so it knows what was said before the barge-in.
    frames = heard_before + rest.frames
    assert sum(len(f.packets[0]) for f in frames) // 4 == round(done.audio_s * 48000)
    await engine_idle(server.app, timeout=2.0)
    assert server.app[STATE_KEY].live_utterances == 0

    await stream.send(Text("Still here."))
    await stream.send(End())
    after = await stream.heard()
    assert after.done is not None and after.done.utterance == 1 and after.done.finish_reason in ("stop", "length")
    assert {f.utterance for f in after.frames} == {1}


async def test_cancel_drops_buffered_text_and_a_cancel_with_nothing_to_stop_is_harmless(
    ws_server: Callable, connect: Connect
) -> None:
    stream = await connect(await ws_server())
    await configure(stream, max_buffer_delay_ms=60_000)
    await stream.send(Cancel())
    await stream.send(Text("This is buffered and never"))
    await stream.send(Cancel())
    done = await stream.expect(Done)
    assert (done.utterance, done.finish_reason, done.segments, done.audio_s) == (0, "cancelled", 0, 0.0)
    await stream.send(Text(" spoken."))  # opens utterance 1; the dropped words are not prepended
    await stream.send(End())
    heard = await stream.heard()
    assert [s.text for s in heard.segments] == ["spoken."]
    assert heard.done is not None and heard.done.utterance == 1


async def test_several_utterances_follow_each_other_on_one_socket(ws_server: Callable, connect: Connect) -> None:
    stream = await connect(await ws_server())
    # The second utterance is sent before the first is done: it waits its turn.
    for text in ("First one.", "Second one."):
        await stream.send(Text(text))
        await stream.send(End())
    first, second = await stream.heard(), await stream.heard()
    await configure(stream, format="pcm_s16le")
    await stream.send(Text("Third one."))
    await stream.send(End())
    third = await stream.heard()
    for number, heard in enumerate((first, second, third)):
        assert heard.done is not None and heard.done.utterance == number
        assert {f.utterance for f in heard.frames} == {number} and {s.utterance for s in heard.segments} == {number}
        assert [f.sequence for f in heard.frames] == list(range(len(heard.frames)))
    assert {f.format for f in first.frames + second.frames} == {"opus"} and {f.format for f in third.frames} == {
        "pcm_s16le"
    }


@pytest.mark.isa
async def test_the_next_sentence_continues_the_voice_of_the_previous_one(
    ws_server: Callable, connect: Connect, tiny_tts: VoxCPM
) -> None:
    server = await ws_server()
    stream = await connect(server)
    await configure(stream, format="pcm_f32le", seed=7)
    await stream.send(Text("First sentence. Second sentence."))
    await stream.send(End())
    heard = await stream.heard()
    assert heard.done is not None and heard.done.finish_reason == "stop"
    audio = heard.pcm()
    cut = heard.segments[1].start_sample
    job = SpeechJob("ref", "First sentence.", SynthesisParams(seed=7))
    outputs = [o async for o in server.app[SPEAKER_KEY].speak(job)]
    patches = torch.from_numpy(np.stack([o.patch for o in outputs]))

    np.testing.assert_array_equal(audio[:cut], np.concatenate([o.audio for o in outputs]))
    # Sentence k uses seed + k and, as its prompt, sentence k-1 (its text, a space, and its latent patches).
    voice = VoicePrompt("First sentence. ", patches)
    continued = tiny_tts.generate("Second sentence.", SynthesisParams(seed=8), prompt=voice)
    np.testing.assert_allclose(audio[cut:], continued, atol=1e-5, rtol=0)
    fresh = tiny_tts.generate("Second sentence.", SynthesisParams(seed=8))
    assert fresh.shape != continued.shape or not np.allclose(fresh, continued, atol=1e-3)
