"""The ElevenLabs-compatible endpoints as their API reference describes them, spoken to with a plain WebSocket:
every output format decoded and timed against what the server generated, the alignment's characters and
spans, contexts side by side, close_context after and before a flush, close_socket, keys, and refusals."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import time
from typing import Any

import aiohttp
import av
import numpy as np
import pytest
from aiohttp import WSMsgType
from tests.serving.helpers import STEP_S, clip, engine_busy, form, record_steps

from .helpers import MULTI, TIMEOUT_S, alignments, receive_until_final

pytestmark = pytest.mark.asyncio

KEY = "sk-test"
STREAM = "/v1/text-to-speech/default/stream-input"
SENTENCES = ("Hello there.", "How are you today?")


async def generated_s(server: Any) -> float:
    """The server's ``voxwire_audio_seconds_total``."""
    async with aiohttp.ClientSession() as session, session.get(server.make_url("/metrics")) as response:
        text = await response.text()
    (line,) = [line for line in text.splitlines() if line.startswith("voxwire_audio_seconds_total ")]
    return float(line.split()[1])


def decode(output_format: str, data: bytes) -> tuple[np.ndarray, int]:
    """The audio as int16 samples and its rate, decoded as a client would (FFmpeg for G.711 and mp3)."""
    if output_format.startswith("pcm_"):
        return np.frombuffer(data, dtype="<i2"), int(output_format.split("_")[1])
    demuxer = {"ulaw_8000": "mulaw", "alaw_8000": "alaw"}.get(output_format, "mp3")
    options = {} if demuxer == "mp3" else {"sample_rate": "8000"}
    with av.open(io.BytesIO(data), format=demuxer, options=options) as container:
        rate = container.streams.audio[0].rate
        frames = [frame.to_ndarray() for frame in container.decode(audio=0)]
    samples = np.concatenate(frames, axis=-1).ravel()
    if samples.dtype != np.int16:  # mp3 decodes to float planes
        samples = (np.clip(samples, -1, 1) * 32767).astype(np.int16)
    return samples, rate


def audio_of(messages: list[dict[str, Any]]) -> bytes:
    return b"".join(base64.b64decode(message["audio"]) for message in messages if message.get("audio"))


@pytest.mark.parametrize(
    ("output_format", "tolerance_s"),
    [("pcm_8000", 0.002), ("pcm_16000", 0.002), ("pcm_22050", 0.002), ("pcm_44100", 0.002), ("pcm_48000", 0.002),
     ("ulaw_8000", 0.002), ("alaw_8000", 0.002), ("mp3_22050_32", 0.12), ("mp3_44100_128", 0.06)],
)  # fmt: skip
async def test_stream_input_speaks_in_each_format_with_timed_characters(
    serve, output_format: str, tolerance_s: float
) -> None:
    server = await serve()
    before = await generated_s(server)
    url = server.make_url(f"{STREAM}?output_format={output_format}")
    async with aiohttp.ClientSession() as session, session.ws_connect(url) as ws:
        await ws.send_json({"text": " ", "voice_settings": {"stability": 0.5}, "generation_config": {}})
        for chunk in ("Hello ", "there. How are ", "you today?"):
            await ws.send_json({"text": chunk})
        await ws.send_json({"text": ""})  # end of input
        messages = await receive_until_final(ws)
        closing = await asyncio.wait_for(ws.receive(), TIMEOUT_S)
    assert closing.type is WSMsgType.CLOSE and closing.data == 1000
    assert "contextId" not in messages[0]
    samples, rate = decode(output_format, audio_of(messages))
    assert rate == int(output_format.split("_")[1])
    generated = await generated_s(server) - before
    assert abs(samples.size / rate - generated) < tolerance_s, (samples.size / rate, generated)
    assert np.abs(samples).max() > 100

    timings = alignments(messages)
    assert ["".join(timing["chars"]) for timing in timings] == [sentence + " " for sentence in SENTENCES]
    for timing in timings:
        starts, durations = timing["charStartTimesMs"], timing["charDurationsMs"]
        assert len(starts) == len(durations) == len(timing["chars"])
        assert all(duration >= 0 for duration in durations)
        assert all(a + d == b for a, d, b in zip(starts, durations, starts[1:], strict=False))  # they tile
    # each message's times start from its sentence; its span is that sentence's audio, so together the whole
    spans = sum(timing["charStartTimesMs"][-1] + timing["charDurationsMs"][-1] for timing in timings)
    assert abs(spans / 1000 - generated) < 0.003 * len(timings)
    assert alignments(messages, "normalizedAlignment") == timings  # normalization is off


async def test_sync_alignment_counts_from_the_start_of_the_context(serve) -> None:
    server = await serve()
    url = server.make_url(f"{STREAM}?output_format=pcm_16000&sync_alignment=true")
    async with aiohttp.ClientSession() as session, session.ws_connect(url) as ws:
        await ws.send_json({"text": " "})
        await ws.send_json({"text": " ".join(SENTENCES)})
        await ws.send_json({"text": ""})
        messages = await receive_until_final(ws)
    first, second = alignments(messages)
    first_end = first["charStartTimesMs"][-1] + first["charDurationsMs"][-1]
    assert second["charStartTimesMs"][0] >= first_end  # the second sentence follows the first
    end = second["charStartTimesMs"][-1] + second["charDurationsMs"][-1]
    assert abs(end / 1000 - len(audio_of(messages)) / 2 / 16000) < 0.003


async def test_contexts_speak_side_by_side_and_close_socket_ends_the_connection(serve) -> None:
    server = await serve()
    async with aiohttp.ClientSession() as session, session.ws_connect(server.make_url(MULTI)) as ws:
        for context, text in (("a", "The first context speaks. "), ("b", "The second one too. ")):
            await ws.send_json({"text": " ", "context_id": context})
            await ws.send_json({"text": text, "context_id": context})
        for context in "ab":
            await ws.send_json({"context_id": context, "flush": True})
            await ws.send_json({"context_id": context, "close_context": True})
        messages = await receive_until_final(ws, finals=2)
        by_context = {context: [m for m in messages if m["contextId"] == context] for context in "ab"}
        for context, text in (("a", "The first context speaks. "), ("b", "The second one too. ")):
            samples, _ = decode("mp3_44100_128", audio_of(by_context[context]))  # the default format
            assert samples.size > 0
            assert ["".join(timing["chars"]) for timing in alignments(by_context[context])] == [text]
            assert by_context[context][-1] == {"isFinal": True, "contextId": context}
        # the connection stays open for the next context; a context id may be used again
        await ws.send_json({"text": "Again. ", "context_id": "a"})
        await ws.send_json({"context_id": "a", "flush": True})
        await ws.send_json({"close_socket": True})  # a flushed context is spoken before the socket closes
        messages = await receive_until_final(ws)
        assert audio_of(messages) and messages[-1] == {"isFinal": True, "contextId": "a"}
        closing = await asyncio.wait_for(ws.receive(), TIMEOUT_S)
    assert closing.type is WSMsgType.CLOSE and closing.data == 1000


async def test_close_context_before_a_flush_stops_the_engine_at_once(serve) -> None:
    server = await serve()
    steps = record_steps(server.app, STEP_S)
    async with aiohttp.ClientSession() as session, session.ws_connect(server.make_url(MULTI)) as ws:
        await ws.send_json({"text": " ", "context_id": "turn"})
        await ws.send_json(
            {"text": "A long first sentence that keeps the engine busy. And then ", "context_id": "turn"}
        )
        while True:
            message = json.loads((await asyncio.wait_for(ws.receive(), TIMEOUT_S)).data)
            if message.get("audio"):
                break
        assert engine_busy(server.app)
        await ws.send_json({"context_id": "turn", "close_context": True})  # a barge-in: the turn is abandoned
        closed = time.perf_counter()
        messages = await receive_until_final(ws)
        assert time.perf_counter() - closed < 2.0
        assert messages[-1] == {"isFinal": True, "contextId": "turn"}
        assert not alignments(messages)  # the cut sentence's timings would be wrong: none are sent
        while engine_busy(server.app):
            await asyncio.sleep(0.005)
        after = [ids for started, ids in steps if started > closed and ids]
        assert len(after) <= 1, f"{len(after)} steps still decoded the context after close_context"


async def test_keep_alives_and_a_close_of_a_context_never_opened_change_nothing(serve) -> None:
    server = await serve()
    async with aiohttp.ClientSession() as session, session.ws_connect(server.make_url(MULTI)) as ws:
        await ws.send_json({"text": ""})
        await ws.send_json({"text": "", "context_id": "later"})
        await ws.send_json({"context_id": "never", "close_context": True})
        await ws.send_json({"text": " ", "context_id": "empty"})
        await ws.send_json({"context_id": "empty", "close_context": True})  # nothing to speak: final at once
        assert await receive_until_final(ws) == [{"isFinal": True, "contextId": "empty"}]


async def test_key_in_the_header_or_in_the_first_message(serve) -> None:
    server = await serve(api_keys=(KEY,))
    async with aiohttp.ClientSession() as session:
        url = server.make_url(f"{STREAM}?output_format=pcm_16000")
        async with session.ws_connect(url, headers={"xi-api-key": KEY}) as ws:
            await ws.send_json({"text": "Hi. "})
            await ws.send_json({"text": ""})
            assert audio_of(await receive_until_final(ws))
        async with session.ws_connect(url) as ws:  # a browser cannot set headers: the key in the first message
            await ws.send_json({"text": " ", "xi_api_key": KEY})
            await ws.send_json({"text": "Hi. "})
            await ws.send_json({"text": ""})
            assert audio_of(await receive_until_final(ws))
        for first in ({"text": " "}, {"text": " ", "xi_api_key": "wrong"}):
            async with session.ws_connect(url) as ws:
                await ws.send_json(first)
                closing = await asyncio.wait_for(ws.receive(), TIMEOUT_S)
                assert closing.type is WSMsgType.CLOSE and closing.data == 1008
                assert ws.close_code == 1008 and closing.extra.startswith("unauthorized")
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await session.ws_connect(url, headers={"xi-api-key": "wrong"})
        assert refused.value.status == 401


@pytest.mark.parametrize(
    ("path", "status"),
    [("/v1/text-to-speech/nobody/stream-input", 404), (f"{STREAM}?output_format=opus_16000_64", 400),
     (f"{MULTI}?output_format=pcm_12345", 400), (f"{STREAM}?seed=x", 400), (f"{STREAM}?seed=-1", 400),
     (f"{MULTI}?seed={2**63}", 400)],
)  # fmt: skip
async def test_refused_before_the_upgrade(serve, path: str, status: int) -> None:
    server = await serve()
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await session.ws_connect(server.make_url(path))
    assert refused.value.status == status


async def test_bad_messages_get_an_error_and_the_connection_goes_on(serve) -> None:
    server = await serve(max_queued_utterances=1)
    async with aiohttp.ClientSession() as session, session.ws_connect(server.make_url(MULTI)) as ws:
        await ws.send_str("not json")
        assert (await ws.receive_json(timeout=TIMEOUT_S))["error"] == "invalid_json"
        await ws.send_json({"text": 5})
        assert (await ws.receive_json(timeout=TIMEOUT_S))["error"] == "invalid_field"
        await ws.send_bytes(b"\x00")
        assert (await ws.receive_json(timeout=TIMEOUT_S))["error"] == "binary_frame"
        await ws.send_json({"text": " ", "context_id": "one"})
        await ws.send_json({"text": " ", "context_id": "two"})  # past max_queued_utterances live contexts
        refused = await ws.receive_json(timeout=TIMEOUT_S)
        assert refused["error"] == "too_many_utterances" and refused["contextId"] == "two"
        await ws.send_json({"text": "Still here. ", "context_id": "one", "flush": True})
        await ws.send_json({"context_id": "one", "close_context": True})
        assert audio_of(await receive_until_final(ws))


async def test_a_context_whose_text_was_refused_still_ends(serve) -> None:
    server = await serve(max_text_chars_per_message=20)
    async with aiohttp.ClientSession() as session, session.ws_connect(server.make_url(MULTI)) as ws:
        await ws.send_json({"text": "This text is longer than the limit. ", "context_id": "c", "flush": True})
        await ws.send_json({"context_id": "c", "close_context": True})
        messages = await receive_until_final(ws)
    assert messages[0]["error"] == "text_too_long" and messages[0]["contextId"] == "c"
    assert messages[-1] == {"isFinal": True, "contextId": "c"} and not audio_of(messages)


@pytest.mark.parametrize(
    ("message", "code"),
    [('{"text": "Hi. ", "context_id": "\\ud800", "flush": true}', "invalid_field"),
     ('{"text": "Hi \\ud800. ", "context_id": "c", "flush": true}', "invalid_field"),
     (json.dumps({"text": "Hi. ", "context_id": "x" * 65, "flush": True}), "invalid_field")],
    ids=["lone-surrogate-context-id", "lone-surrogate-text", "context-id-over-64-bytes"],
)  # fmt: skip
async def test_a_bad_string_is_refused_and_the_connection_goes_on(serve, message: str, code: str) -> None:
    server = await serve()
    async with aiohttp.ClientSession() as session, session.ws_connect(server.make_url(MULTI)) as ws:
        await ws.send_str(message)
        refused = await ws.receive_json(timeout=TIMEOUT_S)
        assert refused["error"] == code and "contextId" not in refused  # no context was opened
        await ws.send_json({"text": "Still here. ", "context_id": "c", "flush": True})
        await ws.send_json({"context_id": "c", "close_context": True})
        messages = await receive_until_final(ws)
    assert audio_of(messages) and messages[-1] == {"isFinal": True, "contextId": "c"}


async def test_a_voice_deleted_after_the_upgrade_is_refused_per_context_and_the_connection_goes_on(serve) -> None:
    server = await serve()
    async with aiohttp.ClientSession() as session:
        async with session.post(server.make_url("/v1/voices"), data=form(clip())) as response:
            voice = (await response.json())["id"]
        path = f"/v1/text-to-speech/{voice}/multi-stream-input?output_format=pcm_16000"
        async with session.ws_connect(server.make_url(path)) as ws:
            async with session.delete(server.make_url(f"/v1/voices/{voice}")) as response:
                assert response.status == 200
            for context in ("a", "b"):
                await ws.send_json({"text": "Hello there. ", "context_id": context, "flush": True})
                refused = await ws.receive_json(timeout=TIMEOUT_S)
                assert refused["error"] == "unknown_voice" and refused["contextId"] == context
            await ws.send_json({"close_socket": True})
            closing = await asyncio.wait_for(ws.receive(), TIMEOUT_S)
    assert closing.type is WSMsgType.CLOSE and closing.data == 1000


@pytest.mark.parametrize(
    "first", ["not json", '{"text": " ", "xi_api_key": 5}', b"\x00"], ids=["json", "type", "binary"]
)
async def test_a_refused_first_message_without_a_key_closes_the_connection(serve, first: str | bytes) -> None:
    # Else a client with no key could keep its connection (and its slot) open by sending messages the
    # server refuses, each of which resets the idle clock.
    server = await serve(api_keys=(KEY,))
    async with aiohttp.ClientSession() as session, session.ws_connect(server.make_url(STREAM)) as ws:
        await (ws.send_bytes(first) if isinstance(first, bytes) else ws.send_str(first))
        closing = await asyncio.wait_for(ws.receive(), TIMEOUT_S)
    assert closing.type is WSMsgType.CLOSE and closing.data == 1008 and closing.extra.startswith("unauthorized")


async def test_text_sent_to_a_closed_context_is_refused_not_dropped_silently(serve) -> None:
    server = await serve()
    async with aiohttp.ClientSession() as session, session.ws_connect(server.make_url(MULTI)) as ws:
        await ws.send_json({"text": "Hello there. ", "context_id": "a", "flush": True})
        await ws.send_json({"context_id": "a", "close_context": True})
        await ws.send_json({"text": "One more thing. ", "context_id": "a", "flush": True})
        messages = await receive_until_final(ws)
    refused = [message for message in messages if "error" in message]
    assert refused and refused[0]["error"] == "invalid_message" and refused[0]["contextId"] == "a"
    assert "close" in refused[0]["message"]
    assert [alignment["chars"] for alignment in alignments(messages)] == [[*"Hello there.", " "]]
