"""``voxwire.integrations.livekit.TTS`` in LiveKit Agents' own TTS machinery, with the server in process: streamed
text, a whole text, an interruption, one pooled connection across turns, ``prewarm``, ``update_options``, timed
transcripts, and a refused voice."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from livekit.agents import APIStatusError
from livekit.agents.tts import SynthesizedAudio
from livekit.agents.types import USERDATA_TIMED_TRANSCRIPT, TimedString
from tests.serving.helpers import STEP_S, engine_busy, record_steps

from voxwire.integrations import livekit as voxwire
from voxwire.integrations.session import SpeechSettings

from .conftest import (
    TIMEOUT_S,
    CountedServe,
    record_requests,
    save_voice,
    solo_audio,
)

pytestmark = pytest.mark.asyncio

RATE = 24000


def samples_of(events: list[SynthesizedAudio]) -> np.ndarray:
    return np.concatenate([np.frombuffer(event.frame.data, dtype=np.int16) for event in events])


async def turn(tts: voxwire.TTS, *tokens: str) -> list[SynthesizedAudio]:
    """One agent turn as LiveKit's voice pipeline drives it: a stream, the tokens, the end of its input."""
    stream = tts.stream()
    for token in tokens:
        stream.push_text(token)
    stream.end_input()
    try:
        return [event async for event in stream]
    finally:
        await stream.aclose()


async def test_stream_speaks_incremental_text_before_it_ends(serve, slow_down, monkeypatch) -> None:
    server = await serve()
    slow_down(server.app, 0.02)
    requests = record_requests(server.app, monkeypatch)
    tts = voxwire.TTS(base_url=str(server.make_url("/")), seed=1)
    stream = tts.stream()
    for token in ("The first ", "sentence is ", "here. ", "The second"):
        stream.push_text(token)
    first = await asyncio.wait_for(anext(stream), TIMEOUT_S)  # the second sentence is not complete yet
    assert first.frame.sample_rate == RATE and first.frame.num_channels == 1
    stream.push_text(" one ends now.")
    stream.end_input()
    rest = [event async for event in stream]
    await stream.aclose()
    await tts.aclose()
    assert requests == [("The first sentence is here.", False), ("The second one ends now.", True)]
    assert samples_of([first, *rest]).size > 0
    assert rest[-1].is_final
    timed = timed_transcript([first, *rest])
    spoken = "The first sentence is here. The second one ends now."
    assert [str(text) for text in timed] == [f"{word} " for word in spoken.split()], "one TimedString a word"
    times = [t for text in timed for t in (text.start_time, text.end_time)]
    assert times == sorted(times) and times[0] >= 0.0 and times[-1] <= samples_of([first, *rest]).size / RATE
    assert all(text.start_time < text.end_time for text in timed)
    # the second sentence's words are timed after the first sentence's audio
    assert timed[5].start_time >= timed[4].end_time > 0.0


def timed_transcript(events: list[SynthesizedAudio]) -> list[TimedString]:
    """The timed transcript LiveKit attached to ``events``' frames, in order."""
    return [text for event in events for text in event.frame.userdata.get(USERDATA_TIMED_TRANSCRIPT, [])]


async def test_synthesize_speaks_a_whole_text(serve) -> None:
    server = await serve()
    tts = voxwire.TTS(base_url=str(server.make_url("/")))
    async with tts.synthesize("Hello from LiveKit. It works.") as stream:
        events = [event async for event in stream]
    await tts.aclose()
    audio = samples_of(events)
    assert audio.size > 0 and np.abs(audio).max() > 0
    assert {event.frame.sample_rate for event in events} == {RATE}


async def test_turns_share_one_prewarmed_connection_and_update_options_changes_the_next_turn(
    counted_serve: CountedServe,
) -> None:
    server, upgrades = await counted_serve()
    voice = await save_voice(server)
    tts = voxwire.TTS(base_url=str(server.make_url("/")), seed=1, sample_rate=RATE)
    tts.prewarm()
    deadline = time.monotonic() + TIMEOUT_S
    while not upgrades and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert len(upgrades) == 1, "prewarm opened the connection before any turn"

    first = samples_of(await turn(tts, "Hello there."))
    tts.update_options(voice=voice)
    second = samples_of(await turn(tts, "Hello there."))
    third = samples_of(await turn(tts, "Hello there."))
    await tts.aclose()
    assert len(upgrades) == 1, f"{len(upgrades)} connections for three turns"

    url_settings = SpeechSettings(seed=1)
    assert first.tobytes() == await solo_audio(server, url_settings, "Hello there.", RATE)
    expected = await solo_audio(server, SpeechSettings(voice=voice, seed=1), "Hello there.", RATE)
    assert second.tobytes() == expected == third.tobytes(), "the new voice speaks from the next turn on"
    assert second.tobytes() != first.tobytes()


async def test_an_unknown_voice_fails_the_turn_without_retrying(counted_serve: CountedServe) -> None:
    server, upgrades = await counted_serve()
    tts = voxwire.TTS(base_url=str(server.make_url("/")), voice="voice_does_not_exist")
    errors: list[object] = []
    tts.on("error", errors.append)
    with pytest.raises(APIStatusError) as refused:
        await turn(tts, "Hello there.")
    await tts.aclose()
    assert refused.value.status_code == 404 and not refused.value.retryable
    assert "unknown_voice" in str(refused.value)
    assert len(upgrades) == 1 and len(errors) == 1


async def test_interruption_stops_the_server_within_one_step_and_the_connection_serves_the_next_turn(
    counted_serve: CountedServe,
) -> None:
    server, upgrades = await counted_serve()
    steps = record_steps(server.app, STEP_S)
    tts = voxwire.TTS(base_url=str(server.make_url("/")), seed=1)
    stream = tts.stream()
    first_sentence = "This sentence is long enough to keep speaking for quite a while, word after word after word."
    stream.push_text(f"{first_sentence} And another one follows it. ")
    heard = [await asyncio.wait_for(anext(stream), TIMEOUT_S)]
    while not timed_transcript(heard):  # the barge-in comes once some words were timed
        heard.append(await asyncio.wait_for(anext(stream), TIMEOUT_S))
    assert engine_busy(server.app)
    await stream.aclose()  # what LiveKit does when the user barges in
    # The transcript holds the first words of the sentence being spoken: not all of it, not none, each timed
    # within the audio that came before the interruption.
    timed = timed_transcript(heard)
    words = first_sentence.split()
    assert 0 < len(timed) < len(words) and [str(text) for text in timed] == [f"{w} " for w in words[: len(timed)]]
    assert timed[-1].end_time <= samples_of(heard).size / RATE
    interrupted = time.perf_counter()
    while engine_busy(server.app):
        await asyncio.sleep(0.005)
    decoding_after = [ids for started, ids in steps if started > interrupted and ids]
    assert len(decoding_after) <= 1, f"{len(decoding_after)} steps still decoded the utterance after the interruption"

    events = await turn(tts, "Yes?")  # on the same connection; the interrupted turn's late frames are dropped
    await tts.aclose()
    assert samples_of(events).size > 0 and events[-1].is_final
    assert len(upgrades) == 1
