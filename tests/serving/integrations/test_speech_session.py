"""``SpeechSession``, the protocol bookkeeping the framework services share, against the server in process."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from voxwire.client.errors import ServerError
from voxwire.integrations.session import Audio, SpeechSession, SpeechSettings
from voxwire.protocol.wire import AudioFrame, Done, Segment
from voxwire.serving.runtime.keys import SPEAKER_KEY

pytestmark = pytest.mark.asyncio

TIMEOUT_S = 60.0


async def next_event(events, kind: type) -> object:  # type: ignore[no-untyped-def]
    while True:
        event = await asyncio.wait_for(anext(events), TIMEOUT_S)
        if isinstance(event, kind):
            return event


def record_raw_frames(session: SpeechSession) -> list[int]:
    """The utterance number of every audio frame the connection receives from now on."""
    numbers: list[int] = []
    receive = session.connection.receive

    async def recording() -> object:
        received = await receive()
        if isinstance(received, AudioFrame):
            numbers.append(received.utterance)
        return received

    session.connection.receive = recording  # type: ignore[method-assign]
    return numbers


def record_sent(session: SpeechSession) -> list[object]:
    """Every message the session sends from now on."""
    sent: list[object] = []
    send = session.connection.send

    async def recording(message: object) -> None:
        sent.append(message)
        await send(message)  # type: ignore[arg-type]

    session.connection.send = recording  # type: ignore[method-assign]
    return sent


async def test_numbers_cancel_and_late_frames(serve, slow_down) -> None:
    server = await serve()
    slow_down(server.app, 0.05)
    url = str(server.make_url("/"))
    async with await SpeechSession.open(url, None, SpeechSettings(seed=3), output_rate=24000) as session:
        assert session.connection.ready.sample_rate == 24000  # a rate the protocol offers: resampled on the server
        events = session.events()
        assert await session.text("This sentence keeps speaking for a while. ") == 0
        assert await session.text("And another one follows it.") == 0  # same utterance until it ends
        first = await next_event(events, Audio)
        assert first.utterance == 0
        await asyncio.sleep(0.3)  # frames pile up unread, as they do when a barge-in comes
        raw_after_cancel = record_raw_frames(session)
        assert await session.cancel() == {0}
        # whatever the server had already sent of utterance 0 is dropped; its done still comes
        after_cancel = []
        while not isinstance(event := await asyncio.wait_for(anext(events), TIMEOUT_S), Done):
            after_cancel.append(event)
        assert not [e for e in after_cancel if isinstance(e, (Audio, Segment))]
        assert 0 in raw_after_cancel, "late frames of utterance 0 did arrive, and were dropped"
        assert (event.utterance, event.finish_reason) == (0, "cancelled")
        assert not session.speaking

        assert await session.text("Next.") == 1
        assert await session.end() == 1
        heard: list[Audio] = []
        while not isinstance(event := await asyncio.wait_for(anext(events), TIMEOUT_S), Done):
            if isinstance(event, Audio):
                heard.append(event)
        assert event.utterance == 1 and event.finish_reason in ("stop", "length")
        assert {a.utterance for a in heard} == {1}
        audio = np.frombuffer(b"".join(a.pcm for a in heard), dtype="<i2")
        assert audio.size > 0 and np.abs(audio).max() > 0
        assert await session.end() is None  # nothing open: nothing sent


@pytest.mark.parametrize("output_rate", [24000, 32000])
async def test_the_server_resamples_to_a_rate_it_offers_and_the_session_to_any_other(serve, output_rate) -> None:
    server = await serve()
    model_rate = server.app[SPEAKER_KEY].info.sample_rate
    offered = output_rate == 24000
    url = str(server.make_url("/"))
    async with await SpeechSession.open(url, None, SpeechSettings(seed=3), output_rate=output_rate) as session:
        assert session.connection.ready.sample_rate == (output_rate if offered else model_rate)
        events = session.events()
        await session.text("Hello there.")
        await session.end()
        pcm = b""
        while not isinstance(event := await asyncio.wait_for(anext(events), TIMEOUT_S), Done):
            if isinstance(event, Audio):
                pcm += event.pcm
    # s16 at the pipeline's rate either way: as long as the speech the server made
    assert len(pcm) / 2 / output_rate == pytest.approx(event.audio_s, abs=0.01)


async def test_configure_sends_a_start_only_for_changed_settings_and_keeps_them_on_a_refusal(serve) -> None:
    server = await serve()
    url = str(server.make_url("/"))
    async with await SpeechSession.open(url, None, SpeechSettings(seed=3), output_rate=24000) as session:
        sent = record_sent(session)
        reader = asyncio.ensure_future(anext(session.events()))  # configure's ready is read by events()
        await session.configure(SpeechSettings(seed=3))
        assert sent == []  # unchanged: no start, no round trip
        await session.configure(SpeechSettings(seed=4))
        assert [type(message).__name__ for message in sent] == ["Start"]
        assert session.connection.ready.seed == 4 and session.settings == SpeechSettings(seed=4)
        with pytest.raises(ServerError) as refused:
            await session.configure(SpeechSettings(voice="voice_does_not_exist"))
        assert refused.value.code == "unknown_voice"
        assert session.settings == SpeechSettings(seed=4)
        reader.cancel()
