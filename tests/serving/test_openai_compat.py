"""``/v1/audio/speech`` as clients of other OpenAI-compatible servers send it (issue 32, items 4, 5 and 8): their
fields accepted (named in ``X-Voxwire-Ignored-Fields``) or honoured (``stream``, ``sample_rate``, ``mulaw``/``alaw``,
``voice`` as an object, ``ref_audio``/``ref_text``), the OpenAI SDK's ``audio.voices``, and files with real sizes.
Requests are sent as those peers' docs send them: raw httpx JSON, or the OpenAI SDK."""

from __future__ import annotations

import base64
import io
import wave

import httpx
import jsonschema
import numpy as np
import openai
import pytest
import soundfile
from aiohttp.test_utils import TestClient, TestServer
from tests.serving.helpers import clip, scrape

from voxwire.audio.g711 import s16_to_mulaw
from voxwire.audio.pcm import UNKNOWN_SIZE
from voxwire.serving.http.openai import IGNORED_FIELDS_HEADER, MAX_LISTED_FIELDS
from voxwire.serving.runtime.keys import INLINE_VOICES_KEY, SPEAKER_KEY, STATE_KEY

from .conftest import Serve

pytestmark = pytest.mark.asyncio

TEXT = "Hi there."
BODY = {"model": "tts-1", "input": TEXT, "voice": "alloy", "seed": 3, "response_format": "pcm"}


async def post(server: TestServer, **fields: object) -> httpx.Response:
    """A speech request as raw httpx sends it (fields override ``BODY``; None drops one)."""
    body = {name: value for name, value in {**BODY, **fields}.items() if value is not None}
    async with httpx.AsyncClient(base_url=str(server.make_url("")), timeout=120) as http:
        return await http.post("/v1/audio/speech", json=body)


def error_code(response: httpx.Response) -> str:
    return str(response.json()["error"]["code"])


def sdk(server: TestServer) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=str(server.make_url("/v1")), api_key="unused", max_retries=0)


def data_uri(audio: bytes) -> str:
    return "data:audio/wav;base64," + base64.b64encode(audio).decode("ascii")


# ---- fields of other servers --------------------------------------------------------------------


async def test_peers_fields_are_accepted_and_named_in_a_header_and_a_metric(client: TestClient) -> None:
    fields = {"stream": True, "user": "u-1", "language": "English", "lang_code": "a", "task_type": "CustomVoice"}
    response = await post(client.server, **fields, temperature=0.7)
    assert response.status_code == 200, response.text
    assert len(response.content) > 0
    assert response.headers[IGNORED_FIELDS_HEADER] == "lang_code, language, task_type, temperature, user"
    metrics = await scrape(client)
    assert metrics['voxwire_ignored_fields_total{field="user"}'] == 1
    assert metrics['voxwire_ignored_fields_total{field="other"}'] == 1  # temperature: no declared field
    plain = await post(client.server)
    assert IGNORED_FIELDS_HEADER not in plain.headers


async def test_the_ignored_fields_header_is_exposed_to_browsers(serve: Serve) -> None:
    server = await serve(allowed_origins=("https://app.example",))
    async with httpx.AsyncClient(base_url=str(server.make_url("")), timeout=120) as http:
        response = await http.post(
            "/v1/audio/speech", json={**BODY, "user": "u"}, headers={"Origin": "https://app.example"}
        )
    assert response.status_code == 200
    assert IGNORED_FIELDS_HEADER in response.headers["Access-Control-Expose-Headers"]


async def test_strict_fields_refuses_unknown_fields_and_still_takes_declared_ones(serve: Serve) -> None:
    server = await serve(strict_fields=True)
    refused = await post(server, temperature=0.7)
    assert (refused.status_code, error_code(refused)) == (400, "unknown_field")
    taken = await post(server, user="u-1")
    assert taken.status_code == 200
    assert taken.headers[IGNORED_FIELDS_HEADER] == "user"


async def test_field_names_no_header_can_carry_are_summed_up_as_other(client: TestClient) -> None:
    many = {f"extra_{index:03}": 1 for index in range(MAX_LISTED_FIELDS + 5)}
    response = await post(client.server, **many, **{"bad\r\nX-Injected: 1": 1, "é": 2})
    assert response.status_code == 200
    listed = response.headers[IGNORED_FIELDS_HEADER].split(", ")
    assert listed == [*sorted(many)[:MAX_LISTED_FIELDS], "other"]
    assert "X-Injected" not in response.headers


@pytest.mark.parametrize(
    ("fields", "code"),
    [
        pytest.param({"task_type": "Clone"}, "invalid_request", id="task-type-not-vllm-omni-s"),
        pytest.param({"language": 3}, "invalid_request", id="language-not-a-string"),
        pytest.param({"voice": {"name": "alloy"}}, "invalid_request", id="voice-object-without-id"),
        pytest.param({"voice": {"id": 7}}, "invalid_request", id="voice-object-id-not-a-string"),
        pytest.param({"stream": "yes"}, "invalid_request", id="stream-not-a-boolean"),
        pytest.param({"stream": False, "stream_format": "sse"}, "invalid_request", id="whole-sse"),
        pytest.param({"sample_rate": 7999}, "invalid_parameter", id="pcm-below-8k"),
        pytest.param({"sample_rate": 16000.5}, "invalid_parameter", id="rate-not-an-integer"),
        pytest.param({"response_format": "opus", "sample_rate": 44100}, "invalid_parameter", id="opus-44k"),
        pytest.param({"response_format": "mp3", "sample_rate": 96000}, "invalid_parameter", id="mp3-96k"),
        pytest.param({"response_format": "mulaw", "sample_rate": 16000}, "invalid_parameter", id="mulaw-16k"),
    ],
)
async def test_peers_fields_with_wrong_values_get_typed_400s(client: TestClient, fields: dict, code: str) -> None:
    response = await post(client.server, **fields)
    assert (response.status_code, error_code(response)) == (400, code)


# ---- rates, telephony, voice objects ------------------------------------------------------------


async def test_16_khz_pcm_lasts_as_long_as_the_24_khz_default(client: TestClient) -> None:
    default = await post(client.server)
    asked = await post(client.server, sample_rate=16000)
    assert asked.headers["Content-Type"] == "audio/pcm;rate=16000;encoding=s16le"
    frames_24k, frames_16k = len(default.content) // 2, len(asked.content) // 2
    # Both resample the same model audio; each rounds its length to the nearest sample (StreamResampler).
    assert abs(frames_16k - frames_24k * 16000 / 24000) <= 1, (frames_16k, frames_24k)


async def test_wav_and_opus_at_an_asked_rate(client: TestClient) -> None:
    wav = await post(client.server, response_format="wav", sample_rate=22050, stream=False)
    assert soundfile.info(io.BytesIO(wav.content)).samplerate == 22050
    ogg = await post(client.server, response_format="opus", sample_rate=16000)
    assert ogg.status_code == 200
    opus_head = ogg.content[ogg.content.index(b"OpusHead") :]
    assert int.from_bytes(opus_head[12:16], "little") == client.server.app[SPEAKER_KEY].info.sample_rate


@pytest.mark.parametrize("law", ["mulaw", "alaw"])
async def test_g711_formats_are_8_khz_bytes_one_a_sample(client: TestClient, law: str) -> None:
    response = await post(client.server, response_format=law)
    assert response.headers["Content-Type"] == f"audio/pcm;rate=8000;encoding={law}"
    pcm_8k = await post(client.server, sample_rate=8000)
    assert len(response.content) == len(pcm_8k.content) // 2
    if law == "mulaw":  # the same G.711 coding as the ElevenLabs socket's ulaw_8000
        assert response.content == s16_to_mulaw(np.frombuffer(pcm_8k.content, dtype="<i2")).tobytes()


async def test_the_openai_sdk_voice_object_speaks_the_named_voice(client: TestClient) -> None:
    by_name = await post(client.server)
    by_object = await post(client.server, voice={"id": "alloy"})
    assert by_object.status_code == 200
    assert by_object.content == by_name.content
    api = sdk(client.server)
    async with api.audio.speech.with_streaming_response.create(
        model="tts-1", voice={"id": "alloy"}, input=TEXT, response_format="pcm"
    ) as response:
        assert len(await response.read()) > 0
    await api.close()


# ---- whole files --------------------------------------------------------------------------------


async def test_a_whole_wav_states_its_real_sizes_and_a_streamed_one_the_unknown_size(client: TestClient) -> None:
    whole = await post(client.server, response_format="wav", stream=False)
    streamed = await post(client.server, response_format="wav")
    assert int(whole.headers["Content-Length"]) == len(whole.content)
    assert streamed.headers["Transfer-Encoding"] == "chunked"
    with wave.open(io.BytesIO(whole.content)) as reader:
        assert reader.getnframes() == (len(whole.content) - 44) // 2
    assert int.from_bytes(streamed.content[40:44], "little") == UNKNOWN_SIZE
    assert whole.content[44:] == streamed.content[44:]  # the same audio


@pytest.mark.isa
async def test_a_whole_flac_is_read_by_soundfile_with_the_wavs_samples(client: TestClient) -> None:
    flac = await post(client.server, response_format="flac", stream=False)
    wav = await post(client.server, response_format="wav", stream=False)
    samples, _ = soundfile.read(io.BytesIO(flac.content), dtype="int16")
    np.testing.assert_array_equal(samples, np.frombuffer(wav.content[44:], dtype="<i2"))


# ---- per-request cloning ------------------------------------------------------------------------


async def test_ref_audio_clones_per_request_and_a_repeated_clip_is_encoded_once(client: TestClient) -> None:
    default = await post(client.server)
    fields = {"ref_audio": data_uri(clip()), "ref_text": "A clip of me.", "task_type": "Base"}
    first = await post(client.server, **fields)
    assert first.status_code == 200, first.text
    assert first.content != default.content  # spoken in the clip's voice, not the default one
    assert first.headers[IGNORED_FIELDS_HEADER] == "task_type, voice"  # the clip replaces the named voice
    again = await post(client.server, **fields)
    assert again.content == first.content
    stats = client.server.app[INLINE_VOICES_KEY].stats
    assert (stats.encoded, stats.reused) == (1, 1)
    bare = await post(client.server, ref_audio=base64.b64encode(clip()).decode("ascii"), voice=None)
    assert bare.status_code == 200  # bare base64, no transcript: a reference clip (voxcpm2 clones one)
    assert stats.encoded == 2


async def test_fish_speech_s_inline_references_clone_as_ref_audio_does(client: TestClient) -> None:
    audio, text = base64.b64encode(clip()).decode("ascii"), "A clip of me."
    by_ref_audio = await post(client.server, ref_audio=audio, ref_text=text)
    by_references = await post(client.server, references=[{"audio": audio, "text": text}])
    assert by_references.status_code == 200, by_references.text
    assert by_references.content == by_ref_audio.content
    stats = client.server.app[INLINE_VOICES_KEY].stats
    assert (stats.encoded, stats.reused) == (1, 1)  # the same clip and transcript: one voice
    unchanged = await post(client.server, references=[])  # fish-speech's default: no clip
    assert unchanged.status_code == 200 and IGNORED_FIELDS_HEADER not in unchanged.headers


@pytest.mark.parametrize(
    "references",
    [
        pytest.param([{"audio": "AAAA", "text": ""}, {"audio": "AAAA", "text": ""}], id="two-clips"),
        pytest.param([{"audio": "AAAA"}], id="no-text"),
        pytest.param([{"audio": "AAAA", "text": "", "tokens": []}], id="unknown-item-field"),
        pytest.param(["AAAA"], id="item-not-an-object"),
        pytest.param({"audio": "AAAA", "text": ""}, id="not-a-list"),
    ],
)
async def test_malformed_references_get_typed_400s(client: TestClient, references: object) -> None:
    response = await post(client.server, references=references)
    assert (response.status_code, error_code(response)) == (400, "invalid_request")
    both = await post(client.server, references=[{"audio": "AAAA", "text": ""}], ref_audio="AAAA")
    assert (both.status_code, error_code(both)) == (400, "invalid_request")


async def test_a_new_ref_audio_waits_for_no_voice_job_slot_and_a_kept_one_needs_none(serve: Serve) -> None:
    server = await serve(max_voice_jobs=1)
    kept = data_uri(clip(seconds=1.0))
    assert (await post(server, ref_audio=kept)).status_code == 200
    state = server.app[STATE_KEY]
    with state.voice_job():  # the one slot taken, as by an upload being encoded
        busy = await post(server, ref_audio=data_uri(clip(seconds=0.8)))
        assert (busy.status_code, error_code(busy), busy.headers["Retry-After"]) == (503, "busy", "1")
        assert (await post(server, ref_audio=kept)).status_code == 200


async def test_inline_voices_keeps_the_most_recently_used_clips(serve: Serve) -> None:
    server = await serve(inline_voices=1)
    first, second = data_uri(clip(seconds=1.0)), data_uri(clip(seconds=0.8))
    for ref_audio in (first, second, first, first):
        assert (await post(server, ref_audio=ref_audio)).status_code == 200
    stats = server.app[INLINE_VOICES_KEY].stats
    assert (stats.encoded, stats.reused) == (3, 1)  # the second clip pushed the first out; then it was kept


@pytest.mark.parametrize(
    ("ref_audio", "code"),
    [
        pytest.param("https://example.com/me.wav", "invalid_audio", id="url"),
        pytest.param("file:///etc/passwd", "invalid_audio", id="file-url"),
        pytest.param("data:audio/wav,RIFF", "invalid_audio", id="data-uri-not-base64"),
        pytest.param("not base64!", "invalid_audio", id="not-base64"),
        pytest.param(base64.b64encode(b"just bytes").decode(), "invalid_audio", id="not-audio"),
    ],
)
async def test_a_ref_audio_the_server_cannot_use_is_refused(client: TestClient, ref_audio: str, code: str) -> None:
    response = await post(client.server, ref_audio=ref_audio)
    assert (response.status_code, error_code(response)) == (400, code)
    assert client.server.app[INLINE_VOICES_KEY].stats.encoded == 0


async def test_a_ref_audio_over_the_upload_limit_is_refused_before_decoding(serve: Serve) -> None:
    server = await serve(max_upload_bytes=4096)
    response = await post(server, ref_audio=data_uri(clip()))
    assert (response.status_code, error_code(response)) == (413, "upload_too_large")


async def test_a_ref_audio_within_the_upload_limit_fits_the_speech_body(serve: Serve) -> None:
    """The speech body's limit makes room for a clip of ``--max-upload-bytes`` as base64, beyond the text's."""
    audio = clip(seconds=2.0)
    server = await serve(max_text_chars_per_utterance=100, max_upload_bytes=len(audio))
    assert len(data_uri(audio)) > 4 * 100 + 64 * 1024  # more than a body of text alone may be
    response = await post(server, ref_audio=data_uri(audio))
    assert response.status_code == 200, response.text


async def test_a_ref_audio_over_the_clip_duration_limit_is_refused(serve: Serve) -> None:
    server = await serve(max_clip_seconds=0.5)
    response = await post(server, ref_audio=data_uri(clip(seconds=1.0)))
    assert (response.status_code, error_code(response)) == (400, "clip_too_long")


# ---- the OpenAI SDK's voices --------------------------------------------------------------------


async def test_the_openai_sdk_creates_speaks_with_and_deletes_a_voice(client: TestClient) -> None:
    api = sdk(client.server)
    voice = await api.audio.voices.create(audio_sample=("me.wav", clip(), "audio/wav"), consent="cons_1234", name="Me")
    assert (voice.object, voice.name, voice.type) == ("audio.voice", "Me", "audio_sample")
    for named in (voice.id, {"id": voice.id}):
        async with api.audio.speech.with_streaming_response.create(
            model="tts-1", voice=named, input=TEXT, response_format="pcm"
        ) as response:
            assert len(await response.read()) > 0
    async with httpx.AsyncClient(base_url=str(client.server.make_url(""))) as http:
        listed = await http.get("/v1/audio/voices")
    assert voice.id in {entry["id"] for entry in listed.json()["voices"]}
    deleted = await api.audio.voices.delete(voice.id)
    assert (deleted.id, deleted.deleted, deleted.object) == (voice.id, True, "audio.voice.deleted")
    assert error_code(await post(client.server, voice=voice.id)) == "unknown_voice"
    with pytest.raises(openai.BadRequestError) as refused:
        await api.audio.voices.create(name="Warm", prompt="A warm voice.", type="prompt")
    assert refused.value.code == "unsupported"
    await api.close()


async def test_a_voice_upload_with_vllm_omni_s_ref_text_is_a_continuation_voice(client: TestClient) -> None:
    async with httpx.AsyncClient(base_url=str(client.server.make_url("")), timeout=120) as http:
        files = {"audio_sample": ("me.wav", clip(), "audio/wav")}
        form = {"consent": "c", "name": "Narrator", "ref_text": "A clip of me.", "speaker_description": "warm"}
        created = await http.post("/v1/audio/voices", files=files, data=form)
        assert created.status_code == 201, created.text
        saved = await http.get("/v1/voices")
    entry = next(item for item in saved.json()["data"] if item["id"] == created.json()["id"])
    assert entry["transcript"] == "A clip of me."


async def test_the_published_schema_takes_what_the_handler_takes(client: TestClient) -> None:
    """Without --strict-fields the document leaves the body open, as the handler does; the peers' fields and the
    voice object are in it (schemathesis fuzzes them: test_openapi_fuzz.py)."""
    async with client.get("/openapi.json") as response:
        speech = (await response.json())["components"]["schemas"]["SpeechRequest"]
    assert "additionalProperties" not in speech
    peers = {"stream", "sample_rate", "ref_audio", "ref_text", "references", "language", "lang_code", "user"}
    assert peers | {"task_type"} <= set(speech["properties"])
    body = {"input": TEXT, "tempo": 1, "voice": {"id": "alloy"}, "response_format": "mulaw", "references": []}
    validator = jsonschema.Draft202012Validator(speech)
    validator.validate(body)
    assert not validator.is_valid({**body, "references": [{"audio": "AAAA"}]})  # as the handler refuses it
    response = await post(client.server, **body)
    assert response.status_code == 200
