"""Voices: upload → use → persist across an app restart → delete, over HTTP; the store's file rules."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from aiohttp.test_utils import TestClient
from tests.serving.helpers import clip, speak_with, upload

from voxwire.prompt import VoicePrompt
from voxwire.serving.speech.voice_store import VOICE_ID_PATTERN, UnknownVoiceError, VoiceLimitError, VoiceStore

pytestmark = pytest.mark.asyncio


async def test_upload_use_persist_across_restart_delete(serve, aiohttp_client, tmp_path: Path) -> None:
    voices_dir = tmp_path / "voices"
    first = await aiohttp_client(await serve(voices_dir=voices_dir))
    status, voice = await upload(first, clip(), transcript="What I say in the clip.", name="Me")
    assert status == 201, voice
    assert VOICE_ID_PATTERN.fullmatch(voice["id"])
    assert voice["name"] == "Me" and voice["transcript"] == "What I say in the clip."
    assert voice["duration_s"] == pytest.approx(1.0, abs=0.01)
    status, reference_voice = await upload(first, clip(0.5))  # no transcript: a voxcpm2 reference voice
    assert status == 201 and reference_voice["transcript"] is None
    assert await speak_with(first, voice["id"]) == 200
    assert await speak_with(first, reference_voice["id"]) == 200
    await first.close()

    second = await aiohttp_client(await serve(voices_dir=voices_dir))
    async with second.get("/v1/voices") as response:
        listed = await response.json()
    saved = {v["id"] for v in listed["data"] if not v["builtin"]}
    assert saved == {voice["id"], reference_voice["id"]}  # same second: any order
    assert await speak_with(second, voice["id"]) == 200
    async with second.delete(f"/v1/voices/{voice['id']}") as response:
        assert response.status == 200
        assert await response.json() == {"id": voice["id"], "object": "voice", "deleted": True, "status": "ok"}
    async with second.delete(f"/v1/voices/{voice['id']}") as response:
        assert response.status == 404
        assert (await response.json())["error"]["code"] == "unknown_voice"
    assert sorted(p.name for p in voices_dir.iterdir()) == sorted(
        f"{reference_voice['id']}{suffix}" for suffix in (".json", ".safetensors")
    )
    assert await speak_with(second, voice["id"]) == 404


@pytest.mark.parametrize(
    "voice_id", ["..", "..%2F..%2Fetc%2Fpasswd", "%2E%2E", "voice_0123456789abcdef.json", "VOICE_0123456789ABCDEF"]
)
async def test_ids_that_could_name_paths_are_unknown_voices(serve, aiohttp_client, tmp_path: Path, voice_id) -> None:
    voices_dir = tmp_path / "voices"
    outside = tmp_path / "etc"
    outside.mkdir()
    (outside / "passwd").write_text("keep me")
    client = await aiohttp_client(await serve(voices_dir=voices_dir))
    async with client.delete(f"/v1/voices/{voice_id}") as response:
        assert response.status in (404, 405)  # 405: a path the router resolved elsewhere, never a file
        assert (await response.json())["error"]["code"] in ("unknown_voice", "not_found", "method_not_allowed")
    assert (outside / "passwd").read_text() == "keep me"


@pytest.mark.parametrize(
    ("audio", "fields", "overrides", "status", "code"),
    [
        pytest.param(b"this is not audio at all", {"transcript": "x"}, {}, 400, "invalid_audio", id="not-audio"),
        pytest.param(b"", {"transcript": "x"}, {}, 400, "invalid_audio", id="empty-file"),
        pytest.param(None, {"transcript": "x"}, {}, 400, "invalid_request", id="no-file"),
        pytest.param(clip(), {"colour": "red"}, {}, 400, "invalid_request", id="unknown-part"),
        pytest.param(clip(2.0), {}, {"max_clip_seconds": 1.5}, 400, "clip_too_long", id="clip-too-long"),
        pytest.param(clip(2.0), {}, {"max_upload_bytes": 1000}, 413, "upload_too_large", id="upload-too-large"),
        pytest.param(clip(), {}, {"max_voices": 1}, 409, "voice_limit", id="store-full"),
    ],
)
async def test_bad_uploads_get_a_typed_error(serve, aiohttp_client, audio, fields, overrides, status, code) -> None:
    client = await aiohttp_client(await serve(**overrides))
    if code == "voice_limit":
        assert (await upload(client, clip()))[0] == 201
    got, body = await upload(client, audio, **fields)
    assert (got, body["error"]["code"]) == (status, code), body
    async with client.get("/v1/voices") as response:
        assert response.status == 200  # the server is unharmed


async def test_an_upload_that_is_not_multipart_is_refused(client: TestClient) -> None:
    async with client.post("/v1/voices", json={"file": "x"}) as response:
        assert response.status == 400
        assert (await response.json())["error"]["code"] == "invalid_request"


# ---- the store alone ---------------------------------------------------------------------------


def prompt(patches: int = 3, shape: tuple[int, int] = (2, 4)) -> VoicePrompt:
    return VoicePrompt("words", torch.randn(patches, *shape))


async def test_store_round_trips_latents_and_skips_what_it_cannot_use(tmp_path: Path) -> None:
    store = VoiceStore(tmp_path, "model-a", (2, 4), max_voices=10)
    original = prompt()
    info = await store.add(original, name=None, duration_s=1.23456)
    assert info.name == info.id and info.duration_s == 1.235
    (tmp_path / "voice_ffffffffffffffff.json").write_text("{broken")  # a crash mid-write of another voice
    (tmp_path / "voice_eeeeeeeeeeeeeeee.json").write_text(json.dumps({**json.loads(_meta(tmp_path, info.id)),
                                                                       "id": "voice_eeeeeeeeeeeeeeee"}))  # fmt: skip
    (tmp_path / "notes.json").write_text("{}")

    reloaded = VoiceStore(tmp_path, "model-a", (2, 4), max_voices=10)
    reloaded.load()
    assert [v.id for v in reloaded.infos()] == [info.id]
    assert np.array_equal(reloaded.get(info.id).prompt.audio_patches, original.audio_patches)
    assert reloaded.get(info.id).prompt.text == "words"

    other_model = VoiceStore(tmp_path, "model-b", (2, 5), max_voices=10)
    other_model.load()
    assert len(other_model) == 0


def _meta(folder: Path, voice_id: str) -> str:
    return (folder / f"{voice_id}.json").read_text()


async def test_voice_files_are_those_the_torch_writer_made(tmp_path: Path) -> None:
    """The store writes latents with numpy (frontends have no torch): the files are byte for byte those that
    safetensors' torch writer, which earlier versions used, makes of the same patches, and such files load."""
    from safetensors.torch import save_file

    store = VoiceStore(tmp_path, "m", (2, 4), max_voices=10)
    original = VoicePrompt("words", torch.randn(3, 2, 4), torch.randn(2, 2, 4))
    info = await store.add(original, name="new", duration_s=1.0)
    written = (tmp_path / f"{info.id}.safetensors").read_bytes()
    as_torch = {name: torch.from_numpy(getattr(original, name)) for name in ("audio_patches", "reference_patches")}
    save_file(as_torch, str(tmp_path / "by-torch.safetensors"))
    assert written == (tmp_path / "by-torch.safetensors").read_bytes()

    old_id = "voice_00112233445566aa"  # a voice an earlier version saved
    save_file(as_torch, str(tmp_path / f"{old_id}.safetensors"))
    (tmp_path / f"{old_id}.json").write_text(json.dumps({**json.loads(_meta(tmp_path, info.id)), "id": old_id}))
    reloaded = VoiceStore(tmp_path, "m", (2, 4), max_voices=10)
    reloaded.load()
    old = reloaded.get(old_id).prompt
    assert old.text == "words" and old.audio_patches.dtype == old.reference_patches.dtype == np.float32
    assert np.array_equal(old.audio_patches, original.audio_patches)
    assert np.array_equal(old.reference_patches, original.reference_patches)
    assert old.digest == original.digest  # the engine's voice cache knows it as the same voice


async def test_store_resolves_default_names_and_enforces_its_limit() -> None:
    store = VoiceStore(None, "m", (2, 4), max_voices=1)
    for name in (None, "alloy", "Nova", "default", "shimmer"):
        assert store.resolve(name) is None
    info = await store.add(prompt(), name="x", duration_s=1.0)
    assert store.resolve(info.id) is store.get(info.id).prompt
    with pytest.raises(VoiceLimitError):
        await store.add(prompt(), name="y", duration_s=1.0)
    for bad in ("../x", "voice_../../etc", "", "voice_0123456789abcdef/.."):
        with pytest.raises(UnknownVoiceError):
            store.resolve(bad)
    await store.delete(info.id)
    with pytest.raises(UnknownVoiceError):
        await store.delete(info.id)


async def test_an_empty_transcript_field_means_no_transcript(client: TestClient) -> None:
    """Browser forms send empty fields: an empty transcript makes a reference voice, not an error."""
    status, voice = await upload(client, clip(0.5), transcript="  ", name="From a form")
    assert status == 201, voice
    assert await speak_with(client, voice["id"]) == 200
