"""docs/clients.md's Twilio Media Streams bridge, run as written (only the server address changed): every message
it sends is a Twilio ``media`` message for the call's stream, and their payloads are exactly the mu-law bytes the
server sends as binary frames for the same text and seed (the JSON transport re-wraps, never re-encodes)."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from voxwire.protocol.wire import AudioFrame

pytestmark = pytest.mark.asyncio

DOCS = Path(__file__).resolve().parents[2] / "docs" / "clients.md"
HEADING = "## Phone gateways"
TEXT = "Your table is booked for eight. Anything else?"
SEED = 5
STREAM_SID = "MZ18ad3ab5a668481ce02b83e7395059f0"
MULAW_8K = {"format": "pcm_mulaw", "sample_rate": 8000}


def bridge(server_url: str) -> Any:
    """The docs' ``speak_into_call``, its ``VOXWIRE_URL`` pointed at ``server_url``."""
    section = DOCS.read_text(encoding="utf-8").split(HEADING, 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert code is not None, f"no Python block under {HEADING!r}"
    source = code.group(1).replace("ws://127.0.0.1:8000/v1/tts/stream", server_url)
    assert server_url in source, "the snippet no longer names the server's address as VOXWIRE_URL"
    namespace: dict[str, Any] = {}
    exec(compile(source, str(DOCS), "exec"), namespace)
    return namespace["speak_into_call"]


class FakeCall:
    """A Twilio bidirectional Media Stream as the bridge sees it: a socket it sends JSON text to."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    async def send(self, data: str) -> None:
        self.sent.append(json.loads(data))


async def binary_mulaw(url: str) -> bytes:
    """The utterance's mu-law bytes as binary frames carry them, for the same text and seed."""
    payloads = []
    async with aiohttp.ClientSession() as session, session.ws_connect(url) as ws:
        assert (await ws.receive_json())["type"] == "ready"
        await ws.send_json({"type": "start", **MULAW_8K, "seed": SEED})
        await ws.send_json({"type": "text", "text": TEXT})
        await ws.send_json({"type": "end"})
        while True:
            message = await ws.receive()
            if message.type is aiohttp.WSMsgType.BINARY:
                frame = AudioFrame.decode(message.data)
                assert frame.format == "pcm_mulaw"
                payloads.append(frame.payload())
            else:
                assert message.type is aiohttp.WSMsgType.TEXT, message
                reply = json.loads(message.data)
                assert reply["type"] != "error", reply
                if reply["type"] == "done":
                    return b"".join(payloads)


async def test_the_documented_bridge_sends_twilio_media_messages_of_the_servers_mulaw(serve) -> None:
    server = await serve()
    url = str(server.make_url("/v1/tts/stream")).replace("http://", "ws://")
    call = FakeCall()

    await bridge(url)(call, STREAM_SID, TEXT, seed=SEED)

    assert call.sent, "the bridge sent the call nothing"
    assert {message["event"] for message in call.sent} == {"media"}
    assert {message["streamSid"] for message in call.sent} == {STREAM_SID}
    mulaw = b"".join(base64.b64decode(message["media"]["payload"], validate=True) for message in call.sent)
    assert len(mulaw) / 8000 > 0.5  # one byte per sample at 8 kHz: over half a second of speech
    assert mulaw == await binary_mulaw(url)


async def test_the_documented_bridge_raises_the_servers_error(serve) -> None:
    server = await serve()
    url = str(server.make_url("/v1/tts/stream")).replace("http://", "ws://")
    with pytest.raises(RuntimeError, match=r"^unknown_voice: "):
        await bridge(url)(FakeCall(), STREAM_SID, TEXT, voice="voice_0123456789abcdef")
