"""ElevenLabs' HTTP text-to-speech and voices, driven by ElevenLabs' own Python SDK (``AsyncElevenLabs``, its
documented async client) with only its ``base_url`` changed, and by raw requests for what the SDK cannot send."""

from __future__ import annotations

import base64
import io
from typing import Any

import av
import numpy as np
import pytest
from aiohttp.test_utils import TestClient, TestServer
from elevenlabs import VoiceSettings
from elevenlabs.client import AsyncElevenLabs
from elevenlabs.core.api_error import ApiError as ElevenLabsApiError
from tests.serving.helpers import clip, upload

from voxwire.serving.runtime.keys import INLINE_VOICES_KEY, SPEAKER_KEY

pytestmark = pytest.mark.asyncio

KEY = "sk-test"
TEXT = "Hello there. This is a test."
RACHEL = "21m00Tcm4TlvDq8ikWAM"
"""ElevenLabs' best known premade voice id, as agents' configurations name it."""


def sdk(server: TestServer) -> AsyncElevenLabs:
    return AsyncElevenLabs(base_url=str(server.make_url("/")).rstrip("/"), api_key=KEY, timeout=60)


def decoded_seconds(data: bytes) -> float:
    """The duration of an encoded file (mp3, Ogg Opus), decoded by FFmpeg."""
    with av.open(io.BytesIO(data)) as container:
        frames = [frame for frame in container.decode(audio=0)]
    return sum(frame.samples for frame in frames) / frames[0].sample_rate


async def test_convert_gives_mp3_by_default_that_decodes(serve) -> None:
    server = await serve(api_keys=(KEY,))
    mp3 = b"".join([chunk async for chunk in sdk(server).text_to_speech.convert("default", text=TEXT, seed=1)])
    assert mp3[:3] == b"ID3" or mp3[0] == 0xFF
    assert decoded_seconds(mp3) > 0


async def test_stream_pcm_16000_lasts_as_long_as_the_audio_generated(serve) -> None:
    server = await serve(api_keys=(KEY,))
    client = sdk(server)
    pcm = b"".join(
        [chunk async for chunk in client.text_to_speech.stream("alloy", text=TEXT, output_format="pcm_16000", seed=1)]
    )
    info = server.app[SPEAKER_KEY].info
    pcm_48k = b"".join(
        [chunk async for chunk in client.text_to_speech.stream("alloy", text=TEXT, output_format="pcm_48000", seed=1)]
    )
    samples = np.frombuffer(pcm, dtype="<i2")
    # The same seed speaks the same audio; each rate carries its duration to within the resampler's last sample.
    assert samples.size / 16000 == pytest.approx(len(pcm_48k) / 2 / 48000, abs=1 / 16000)
    assert samples.size / 16000 > 2 * info.samples_per_patch / info.sample_rate
    assert np.abs(samples).max() > 0


async def test_convert_with_timestamps_times_every_character_in_order(serve) -> None:
    server = await serve(api_keys=(KEY,))
    result = await sdk(server).text_to_speech.convert_with_timestamps(
        "default", text=TEXT, output_format="pcm_24000", seed=1
    )
    audio_s = len(base64.b64decode(result.audio_base_64)) / 2 / 24000
    for alignment in (result.alignment, result.normalized_alignment):
        assert alignment is not None
        assert "".join(alignment.characters) == TEXT
        starts, ends = alignment.character_start_times_seconds, alignment.character_end_times_seconds
        assert starts == sorted(starts) and ends == sorted(ends)
        assert all(start <= end for start, end in zip(starts, ends, strict=True))
        assert starts[0] >= 0 and ends[-1] <= audio_s + 1e-3


async def test_stream_with_timestamps_times_every_character_once_across_chunks(serve) -> None:
    server = await serve(api_keys=(KEY,))
    chunks = [
        chunk
        async for chunk in sdk(server).text_to_speech.stream_with_timestamps(
            "default", text=TEXT, output_format="pcm_16000", seed=1
        )
    ]
    assert len(chunks) > 1
    characters = [char for chunk in chunks if chunk.alignment for char in chunk.alignment.characters]
    starts = [t for chunk in chunks if chunk.alignment for t in chunk.alignment.character_start_times_seconds]
    assert "".join(characters) == TEXT
    assert starts == sorted(starts)
    audio = b"".join(base64.b64decode(chunk.audio_base_64) for chunk in chunks)
    assert max(starts) <= len(audio) / 2 / 16000


async def test_speed_07_speaks_longer_than_10(serve) -> None:
    server = await serve(api_keys=(KEY,))
    client = sdk(server)

    async def seconds(speed: float) -> float:
        settings = VoiceSettings(speed=speed)
        chunks = client.text_to_speech.stream(
            "default", text=TEXT, output_format="pcm_16000", seed=1, voice_settings=settings
        )
        return len(b"".join([chunk async for chunk in chunks])) / 2 / 16000

    normal, slow = await seconds(1.0), await seconds(0.7)
    assert slow == pytest.approx(normal / 0.7, rel=0.05)


async def test_a_clip_sent_with_the_request_speaks_in_its_voice_and_is_encoded_once(serve) -> None:
    """Per-request cloning as on /v1/audio/speech: ``ref_audio`` and ``ref_text``, sent through the SDK's documented
    way to add body fields (``request_options``)."""
    server = await serve(api_keys=(KEY,))
    client = sdk(server)
    clip_uri = "data:audio/wav;base64," + base64.b64encode(clip()).decode("ascii")
    extra = {"additional_body_parameters": {"ref_audio": clip_uri, "ref_text": "A clip of me."}}

    async def pcm(**options: Any) -> bytes:
        chunks = client.text_to_speech.stream("default", text=TEXT, output_format="pcm_16000", seed=1, **options)
        return b"".join([chunk async for chunk in chunks])

    default, cloned = await pcm(), await pcm(request_options=extra)
    assert cloned and cloned != default
    assert await pcm(request_options=extra) == cloned
    stats = server.app[INLINE_VOICES_KEY].stats
    assert (stats.encoded, stats.reused) == (1, 1)


async def test_opus_48000_is_ogg_opus(serve) -> None:
    server = await serve(api_keys=(KEY,))
    client = sdk(server)
    ogg = b"".join(
        [c async for c in client.text_to_speech.convert("default", text=TEXT, output_format="opus_48000_64")]
    )
    assert ogg[:4] == b"OggS" and decoded_seconds(ogg) > 0


async def test_an_alias_names_the_voice(serve) -> None:
    server = await serve(api_keys=(KEY,), voice_aliases=((RACHEL, "default"),))
    client = sdk(server)
    audio = [c async for c in client.text_to_speech.convert(RACHEL, text=TEXT, output_format="pcm_16000", seed=1)]
    same = [c async for c in client.text_to_speech.convert("default", text=TEXT, output_format="pcm_16000", seed=1)]
    assert b"".join(audio) == b"".join(same)
    voice = await client.voices.get(RACHEL)
    assert voice.voice_id == "default"
    async with TestClient(server) as http:  # ElevenLabs' socket resolves it too (an unknown voice is 404 there)
        socket = await http.ws_connect(f"/v1/text-to-speech/{RACHEL}/stream-input", headers={"xi-api-key": KEY})
        await socket.close()


async def test_the_sdk_deletes_a_saved_voice(serve) -> None:
    server = await serve(api_keys=(KEY,))
    client = sdk(server)
    async with TestClient(server, headers={"xi-api-key": KEY}) as http:  # its end closes the server: last
        status, saved = await upload(http, clip(), name="Me")
        assert status == 201, saved
        deleted = await client.voices.delete(saved["id"])
        assert deleted.status == "ok"
        with pytest.raises(ElevenLabsApiError) as refused:
            await client.voices.get(saved["id"])
        assert refused.value.status_code == 404


async def test_the_voice_listing_serves_elevenlabs_and_our_clients_alike(serve) -> None:
    server = await serve(api_keys=(KEY,))
    client = sdk(server)
    listed = await client.voices.get_all()
    assert [voice.voice_id for voice in listed.voices][:2] == ["default", "alloy"]
    assert {voice.category for voice in listed.voices} == {"premade"}
    assert (await client.voices.get("Nova")).voice_id == "nova"  # built-in names ignore case, as in requests
    page = await client.voices.search(page_size=2)
    assert [voice.voice_id for voice in page.voices] == ["default", "alloy"] and page.has_more
    rest = await client.voices.search(page_size=100, next_page_token=page.next_page_token)
    assert len(rest.voices) == page.total_count - 2 and not rest.has_more
    # our own clients read the same body's OpenAI-style list
    async with TestClient(server) as http:
        body = await (await http.get("/v1/voices", headers={"Authorization": f"Bearer {KEY}"})).json()
    assert body["object"] == "list" and [entry["id"] for entry in body["data"]][:2] == ["default", "alloy"]


@pytest.mark.parametrize(
    ("path", "body", "status", "code"),
    [
        ("/v1/text-to-speech/nobody", {"text": TEXT}, 404, "unknown_voice"),
        ("/v1/text-to-speech/default?output_format=pcm_11025", {"text": TEXT}, 400, "unsupported_format"),
        ("/v1/text-to-speech/default?optimize_streaming_latency=9", {"text": TEXT}, 400, "invalid_parameter"),
        ("/v1/text-to-speech/default/stream", {"text": " "}, 400, "empty_input"),
        ("/v1/text-to-speech/default/stream", {}, 400, "empty_input"),
        ("/v1/text-to-speech/default/with-timestamps", {"text": TEXT, "seed": -1}, 400, "invalid_parameter"),
        ("/v1/text-to-speech/default", {"text": TEXT, "voice_settings": {"speed": 9}}, 400, "invalid_parameter"),
        ("/v1/text-to-speech/default", {"text": TEXT, "voice_settings": [1]}, 400, "invalid_request"),
        ("/v1/voices/nobody", None, 404, "unknown_voice"),
        ("/v2/voices?page_size=0", None, 400, "invalid_parameter"),
        ("/v2/voices?next_page_token=x", None, 400, "invalid_parameter"),
        ("/v2/voices?page_size=%D9%A3", None, 400, "invalid_parameter"),  # an Arabic-Indic 3 is not an integer here
        ("/v1/text-to-speech/default?enable_logging=yes", {"text": TEXT}, 400, "invalid_parameter"),
    ],
)
async def test_bad_requests_get_typed_errors(serve, path: str, body: Any, status: int, code: str) -> None:
    server = await serve()
    async with TestClient(server) as http:
        method = http.get if body is None else http.post
        kwargs = {} if body is None else {"json": body}
        response = await method(path, **kwargs)
        assert response.status == status, await response.text()
        assert (await response.json())["error"]["code"] == code


async def test_the_sdk_sees_a_refusal_as_its_api_error(serve) -> None:
    server = await serve(api_keys=(KEY,))
    with pytest.raises(ElevenLabsApiError) as refused:
        async for _ in sdk(server).text_to_speech.convert("nobody", text=TEXT):
            pass
    assert refused.value.status_code == 404


async def test_fields_the_sdk_sends_that_this_server_ignores_are_accepted(serve) -> None:
    server = await serve()
    body = {
        "text": TEXT, "model_id": "eleven_multilingual_v2", "language_code": "en", "previous_text": "Before.",
        "next_text": "After.", "apply_text_normalization": "auto", "pronunciation_dictionary_locators": [],
        "voice_settings": {"stability": 0.5, "similarity_boost": 0.75, "style": 0.0, "use_speaker_boost": True},
    }  # fmt: skip
    query = "output_format=ulaw_8000&optimize_streaming_latency=3&enable_logging=false"
    async with TestClient(server) as http:
        response = await http.post(f"/v1/text-to-speech/default/stream?{query}", json=body)
        assert response.status == 200, await response.text()
        assert response.headers["Content-Type"].startswith("audio/")
        assert len(await response.read()) > 0


async def test_a_browser_page_may_send_the_elevenlabs_key_header(serve) -> None:
    page = "https://app.example"
    server = await serve(api_keys=(KEY,), allowed_origins=(page,))
    preflight = {
        "Origin": page,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "xi-api-key",
    }
    async with TestClient(server) as http:
        response = await http.options("/v1/text-to-speech/default/stream", headers=preflight)
        assert response.status == 204
        allowed = {name.strip().lower() for name in response.headers["Access-Control-Allow-Headers"].split(",")}
        assert "xi-api-key" in allowed
        spoken = await http.post(
            "/v1/text-to-speech/default/stream?output_format=pcm_16000",
            json={"text": TEXT},
            headers={"Origin": page, "xi-api-key": KEY},
        )
        assert spoken.status == 200 and spoken.headers["Access-Control-Allow-Origin"] == page
