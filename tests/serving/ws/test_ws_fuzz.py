"""Property: whatever a client sends (JSON of any shape, known types with wrong fields, garbage text, binary
frames, speakable text), the server answers with valid protocol messages, keeps the connection, frees every
engine slot once the client cancels and leaves, and still serves a fresh session."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest
import pytest_asyncio
from aiohttp.test_utils import TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from voxwire.protocol.wire import CLIENT_MESSAGES, FRAME_FORMATS, Error, ErrorCode, Ready
from voxwire.serving.runtime.keys import SESSIONS_KEY, STATE_KEY

from .conftest import Connect, engine_idle, until

pytestmark = pytest.mark.asyncio

FUZZ_LIMITS = {"max_message_bytes": 512, "max_text_chars_per_message": 200, "max_text_chars_per_utterance": 400}
"""Small limits, so the fuzz reaches them; every generated message stays under aiohttp's hard cap (4 x 512 B)."""

SENTINEL_DELAY_MS = 12_345
PAUSE = 0.6
"""A script step that sends nothing for this many seconds, so that utterances get to speak."""
FIELDS = ("text", "voice", "format", "seed", "cfg_value", "inference_timesteps", "max_buffer_delay_ms", "extra")

scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=30)
    | st.sampled_from(["opus", "pcm_f32le", "ogg_opus", "default", "alloy", "voice_0123456789abcdef"])
)
json_values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
)
speakable = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=120) | st.sampled_from(
    ["Hello there. ", "One more sentence", ", and a clause.", "3.14 is pi. ", "你好。", "   "]
)


@st.composite
def arbitrary(draw: st.DrawFn) -> dict[str, Any]:
    """An object of any shape: known and unknown types, any fields, values of any JSON type."""
    kind = draw(st.sampled_from([*CLIENT_MESSAGES, "speak", "done", 7, None]))
    body: dict[str, Any] = {} if kind is None else {"type": kind}
    for name in draw(st.lists(st.sampled_from(FIELDS), max_size=3, unique=True)):
        body[name] = draw(json_values)
    return body


plausible_start = st.fixed_dictionaries(
    {"type": st.just("start")},
    optional={
        "voice": st.sampled_from([None, "default", "alloy", "voice_0123456789abcdef", "../x"]),
        "format": st.sampled_from([*FRAME_FORMATS, "mp3"]),
        "seed": st.integers(-2, 2**64),
        "cfg_value": st.floats(-1, 20, allow_nan=False),
        "inference_timesteps": st.integers(-1, 60),
        "max_buffer_delay_ms": st.integers(-1, 70_000),
    },
)
well_formed = (
    speakable.map(lambda text: {"type": "text", "text": text})
    | plausible_start
    | st.sampled_from([{"type": "flush"}, {"type": "end"}, {"type": "cancel"}])
)
sentences = st.sampled_from(["Hello there. ", "One more sentence. ", "Short.\n", "你好。"]).map(
    lambda text: json.dumps({"type": "text", "text": text}, ensure_ascii=False)
)
frames = (
    sentences
    | (well_formed | arbitrary())
    .map(lambda body: json.dumps(body, ensure_ascii=False))
    .filter(lambda text: len(text.encode()) < 2000)  # under aiohttp's hard cap, which closes the connection
    | st.text(max_size=60)
    | st.binary(max_size=40)
    | st.just(json.dumps({"type": "text", "text": "y" * 600}))  # over max_message_bytes
    | st.just(PAUSE)
)


@pytest_asyncio.fixture
async def fuzz_server(ws_server: Callable) -> TestServer:
    """One server for every example (hypothesis runs the test body many times with the same fixtures)."""
    return await ws_server(**FUZZ_LIMITS)


@pytest.mark.slow
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(script=st.lists(frames, min_size=1, max_size=8))
async def test_no_client_input_breaks_the_server(fuzz_server: TestServer, connect: Connect, script: list) -> None:
    server = fuzz_server
    stream = await connect(server)
    try:  # a failing example closes its connection, so that hypothesis's replay of it starts from a clean server
        for frame in script:
            if frame is PAUSE:
                await asyncio.sleep(PAUSE)
            elif isinstance(frame, bytes):
                await stream.ws.send_bytes(frame)
            else:
                await stream.send(frame)
        await stream.send(json.dumps({"type": "cancel"}))
        await stream.send(json.dumps({"type": "start", "max_buffer_delay_ms": SENTINEL_DELAY_MS}))
        while True:  # every reply is a valid server message (receive() decodes it strictly) until the sentinel's ready
            received = await stream.receive()
            if isinstance(received, Error):
                assert received.code in {code.value for code in ErrorCode}, received
            if isinstance(received, Ready) and received.max_buffer_delay_ms == SENTINEL_DELAY_MS:
                break
    finally:
        await stream.ws.close()

    app = server.app
    await engine_idle(app, timeout=30.0)
    await until(lambda: not app[SESSIONS_KEY] and app[STATE_KEY].live_utterances == 0)
    fresh = await connect(server)
    try:
        await fresh.send(json.dumps({"type": "text", "text": "Ok."}))
        await fresh.send(json.dumps({"type": "end"}))
        heard = await fresh.heard()
        assert heard.done is not None and heard.done.finish_reason in ("stop", "length") and not heard.errors
    finally:
        await fresh.ws.close()
