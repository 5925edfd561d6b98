"""The Wyoming listener against the ``wyoming`` package's own client, as Home Assistant uses it: describe, synthesize,
streaming synthesis, and refusals as ``error`` events that leave the server serving."""

from __future__ import annotations

import asyncio
import io
import wave

import pytest
from aiohttp.test_utils import TestServer
from prometheus_client.parser import text_string_to_metric_families
from tests.serving.conftest import Serve
from tests.serving.helpers import record_engine_jobs
from wyoming.audio import AudioChunk, AudioStart
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Describe, Info
from wyoming.ping import Ping
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeVoice

from voxwire.serving.runtime.keys import METRICS_KEY, SPEAKER_KEY, STATE_KEY, Phase
from voxwire.serving.wyoming.listener import WYOMING_KEY

pytestmark = pytest.mark.asyncio

READ_TIMEOUT_S = 120.0


async def wyoming_server(serve: Serve, **overrides: object) -> tuple[TestServer, int]:
    server = await serve(wyoming_port=0, **overrides)
    port = server.app[WYOMING_KEY].port
    assert port is not None
    return server, port


async def read(client: AsyncTcpClient) -> Event:
    event = await asyncio.wait_for(client.read_event(), READ_TIMEOUT_S)
    assert event is not None, "the server closed the connection"
    return event


async def read_until(client: AsyncTcpClient, last: str) -> list[Event]:
    events = [await read(client)]
    while events[-1].type not in (last, "error"):
        events.append(await read(client))
    return events


def as_wav(events: list[Event]) -> tuple[int, int]:
    """The sample rate and frame count of one ``audio-start``..``audio-stop`` run, through ``wave`` as a client
    would store it."""
    start = AudioStart.from_event(events[0])
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as wav:
        wav.setframerate(start.rate)
        wav.setsampwidth(start.width)
        wav.setnchannels(start.channels)
        for event in events[1:-1]:
            wav.writeframes(AudioChunk.from_event(event).audio)
    buffer.seek(0)
    with wave.open(buffer, "rb") as wav:
        return wav.getframerate(), wav.getnframes()


async def test_describe_lists_one_tts_program_with_voices_and_streaming(serve: Serve) -> None:
    _, port = await wyoming_server(serve)
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(Describe().event())
        info = Info.from_event(await read(client))
    (program,) = info.tts
    assert program.name == "voxwire" and program.installed and program.supports_synthesize_streaming
    names = [voice.name for voice in program.voices]
    assert names[0] == "default" and "alloy" in names
    assert all("en" in voice.languages for voice in program.voices)


async def test_synthesize_answers_audio_at_the_models_rate(serve: Serve) -> None:
    server, port = await wyoming_server(serve)
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(Synthesize("Hello from Home Assistant.", voice=SynthesizeVoice("alloy")).event())
        events = await read_until(client, "audio-stop")
    assert [events[0].type, events[-1].type] == ["audio-start", "audio-stop"]
    assert {event.type for event in events[1:-1]} == {"audio-chunk"}
    rate, frames = as_wav(events)
    assert rate == server.app[SPEAKER_KEY].info.sample_rate
    assert frames > 0


async def test_streaming_speaks_each_sentence_as_it_completes_then_stops(serve: Serve) -> None:
    _, port = await wyoming_server(serve)
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(SynthesizeStart().event())
        await client.write_event(SynthesizeChunk("Hello there. How").event())
        first = await read_until(client, "audio-stop")  # before the stream's end: the first sentence was complete
        for event in (SynthesizeChunk(" are you?").event(), Synthesize("Hello there. How are you?").event()):
            await client.write_event(event)  # Home Assistant sends the whole text too; a streaming server drops it
        await client.write_event(SynthesizeStop().event())
        second = await read_until(client, "audio-stop")
        assert (await read(client)).type == "synthesize-stopped"
    for sentence in (first, second):
        assert [sentence[0].type, sentence[-1].type] == ["audio-start", "audio-stop"]
        assert as_wav(sentence)[1] > 0


async def test_an_unknown_voice_is_an_error_and_the_connection_serves_on(serve: Serve) -> None:
    _, port = await wyoming_server(serve)
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(Synthesize("Hello.", voice=SynthesizeVoice("nobody")).event())
        error = Error.from_event(await read(client))
        assert error.code == "unknown_voice" and "nobody" in error.text
        await client.write_event(Ping("still there").event())
        assert (await read(client)).type == "pong"


async def test_a_garbage_line_is_an_error_not_a_crash(serve: Serve) -> None:
    _, port = await wyoming_server(serve)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"\x00\xffnot an event at all\n")
    error_line = await asyncio.wait_for(reader.readline(), READ_TIMEOUT_S)
    assert b'"type": "error"' in error_line
    writer.close()
    async with AsyncTcpClient("127.0.0.1", port) as client:  # the server still serves
        await client.write_event(Describe().event())
        assert (await read(client)).type == "info"


async def test_a_connection_over_the_limit_is_refused_busy(serve: Serve) -> None:
    _, port = await wyoming_server(serve, max_wyoming_connections=1)
    async with AsyncTcpClient("127.0.0.1", port) as first:
        await first.write_event(Describe().event())
        await read(first)
        async with AsyncTcpClient("127.0.0.1", port) as second:  # its leaving would raise had it been reset
            await second.write_event(Describe().event())  # sent before it could read the refusal, as clients do
            assert Error.from_event(await read(second)).code == "busy"
            assert await second.read_event() is None  # then closed


async def test_a_streams_later_sentence_continues_the_voice_of_the_one_before(
    serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    server, port = await wyoming_server(serve)
    jobs = record_engine_jobs(server.app, monkeypatch)
    async with AsyncTcpClient("127.0.0.1", port) as client:
        for event in (SynthesizeStart(), SynthesizeChunk("Hello there. How are you?"), SynthesizeStop()):
            await client.write_event(event.event())
        events = await read_until(client, "synthesize-stopped")
    assert [event.type for event in events].count("audio-stop") == 2
    first, second = jobs
    assert first.voice is None  # the default voice: the model's own, a new speaker on every request
    assert second.voice is not None and second.voice.text == "Hello there. "


async def test_a_draining_server_refuses_with_an_error_event(serve: Serve) -> None:
    server, port = await wyoming_server(serve)
    async with AsyncTcpClient("127.0.0.1", port) as client:
        server.app[STATE_KEY].phase = Phase.DRAINING
        await client.write_event(Synthesize("Hello.").event())
        assert Error.from_event(await read(client)).code == "shutting_down"
        server.app[STATE_KEY].phase = Phase.READY


async def test_wyoming_utterances_count_in_the_servers_metrics(serve: Serve) -> None:
    server, port = await wyoming_server(serve)

    def utterances() -> float:
        families = text_string_to_metric_families(server.app[METRICS_KEY].exposition().decode())
        return sum(
            s.value for f in families if f.name == "voxwire_utterances" for s in f.samples if s.name.endswith("_total")
        )

    before = utterances()
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(Synthesize("Hello.").event())
        await read_until(client, "audio-stop")
    assert utterances() == before + 1


async def test_a_client_that_does_not_read_holds_only_its_own_connection(serve: Serve) -> None:
    _, port = await wyoming_server(serve)
    async with AsyncTcpClient("127.0.0.1", port) as stalled:
        await stalled.write_event(Synthesize("A long answer nobody reads. " * 5).event())
        async with AsyncTcpClient("127.0.0.1", port) as client:
            await client.write_event(Synthesize("Hello.").event())
            events = await read_until(client, "audio-stop")
    assert events[-1].type == "audio-stop"


async def test_a_client_that_floods_and_never_reads_is_let_go(serve: Serve) -> None:
    # Its answers fill the socket until the write deadline ends the connection while more events wait to be
    # handled: its place must be freed, or it would hold one of --max-wyoming-connections until shutdown.
    _, port = await wyoming_server(serve, max_wyoming_connections=1, write_timeout_s=0.2, max_messages_per_s=1e6)
    _, flooding = await asyncio.open_connection("127.0.0.1", port)
    flooding.write(b'{"type": "describe"}\n' * 10_000)  # answers of about 40 MB, more than both sockets hold

    async def described() -> bool:
        async with AsyncTcpClient("127.0.0.1", port) as client:
            await client.write_event(Describe().event())
            return (await read(client)).type == "info"

    for _ in range(100):
        if await described():
            break
        await asyncio.sleep(0.2)
    else:
        pytest.fail("the flooding connection still holds the only Wyoming place")
    flooding.close()


async def test_a_stream_whose_first_sentence_was_refused_does_not_continue_an_earlier_stream(
    serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    server, port = await wyoming_server(serve)
    jobs = record_engine_jobs(server.app, monkeypatch)
    async with AsyncTcpClient("127.0.0.1", port) as client:
        for event in (SynthesizeStart(), SynthesizeChunk("Hello there. How are you?"), SynthesizeStop()):
            await client.write_event(event.event())
        await read_until(client, "synthesize-stopped")
        server.app[STATE_KEY].phase = Phase.DRAINING
        await client.write_event(SynthesizeStart().event())
        await client.write_event(SynthesizeChunk("Refused. Spoken").event())
        assert Error.from_event(await read(client)).code == "shutting_down"
        server.app[STATE_KEY].phase = Phase.READY
        await client.write_event(SynthesizeStop().event())
        await read_until(client, "synthesize-stopped")
    assert [job.text for job in jobs] == ["Hello there.", "How are you?", "Spoken"]
    assert jobs[1].voice is not None and jobs[2].voice is None
