"""Regression tests of issue 8's probe on voice uploads and the voice store (defects D1, D2, D3, D10, D12).

Each test replays a repro of the probe: poisoned clips, a decompression bomb, an unbounded
transcript, broken files in the voices folder, names with control characters, and one key
deleting another key's voice.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch
from aiohttp.test_utils import TestClient
from tests.serving.helpers import clip, form, speak_with, upload

from voxwire.audio.clip import ClipTooLongError, load_clip
from voxwire.errors import InvalidInputError
from voxwire.prompt import MAX_LATENT_MAGNITUDE, VoicePrompt
from voxwire.serving.speech.voice_store import ORPHAN_GRACE_S, VoiceStore


def constant_wav(value: float, nbytes: int = 64 * 1024, rate: int = 16000) -> bytes:
    """The probe's poisoned clip: float32 WAV samples all equal to ``value`` (finite, absurdly loud)."""
    buffer = io.BytesIO()
    soundfile.write(buffer, np.full(nbytes // 4, value, dtype=np.float32), rate, format="WAV", subtype="FLOAT")
    return buffer.getvalue()


async def speech_bytes(client: TestClient) -> bytes:
    body = {"model": "m", "input": "Hello there.", "response_format": "pcm", "seed": 1}
    async with client.post("/v1/audio/speech", json=body) as response:
        assert response.status == 200
        return await response.read()


# ---- D1: nothing non-finite enters the model -----------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_clip_of_huge_samples_is_refused_and_changes_no_one_elses_audio(serve, aiohttp_client) -> None:
    client = await aiohttp_client(await serve())
    before = await speech_bytes(client)
    for transcript in ({"transcript": "Loud words."}, {}):  # continuation prompt and v2 reference clip
        status, body = await upload(client, constant_wav(3e38), **transcript)
        assert (status, body["error"]["code"]) == (400, "invalid_audio"), body
    async with client.get("/v1/voices") as response:
        assert [voice for voice in (await response.json())["data"] if not voice["builtin"]] == []
    assert await speech_bytes(client) == before


def test_non_finite_latents_never_make_a_prompt() -> None:
    """The one gate: every prompt (encoded clip, disk, continuation) is a ``VoicePrompt``."""
    good = np.zeros((2, 2, 4), np.float32)
    for bad_value in (float("nan"), float("inf"), -float("inf")):
        bad = good.copy()
        bad[1, 0, 3] = bad_value
        with pytest.raises(InvalidInputError, match="not finite"):
            VoicePrompt("words", bad)
        with pytest.raises(InvalidInputError, match="not finite"):
            VoicePrompt(reference_patches=bad)
        with pytest.raises(InvalidInputError, match="not finite"):
            VoicePrompt("words", good).continued(" more", bad)


def test_huge_latents_never_make_a_prompt() -> None:
    """Issue 20 (N12): finite but huge latents (3e38) passed the gate and gave the length cap of silence."""
    good = np.zeros((2, 2, 4), np.float32)
    for huge in (3e38, -1e20, 2 * MAX_LATENT_MAGNITUDE):
        bad = good.copy()
        bad[0, 1, 2] = huge
        with pytest.raises(InvalidInputError, match="above 1000"):
            VoicePrompt("words", bad)
        with pytest.raises(InvalidInputError, match="above 1000"):
            VoicePrompt(reference_patches=bad)
    edge = good.copy()
    edge[0, 0, 0] = -MAX_LATENT_MAGNITUDE
    assert VoicePrompt("words", edge).audio_patches is edge


@pytest.mark.asyncio
async def test_voices_with_non_finite_latents_on_disk_are_skipped(tmp_path: Path, caplog) -> None:
    store = VoiceStore(tmp_path, "m", (2, 4), max_voices=10)
    kept = await store.add(VoicePrompt("words", torch.randn(3, 2, 4)), name="kept", duration_s=1.0)
    poisoned = await store.add(VoicePrompt("words", torch.randn(3, 2, 4)), name="poisoned", duration_s=1.0)
    from safetensors.torch import save_file

    save_file({"audio_patches": torch.full((3, 2, 4), float("nan"))}, str(tmp_path / f"{poisoned.id}.safetensors"))
    reloaded = VoiceStore(tmp_path, "m", (2, 4), max_voices=10)
    reloaded.load()
    assert [info.id for info in reloaded.infos()] == [kept.id]
    assert any(poisoned.id in record.message and "not finite" in record.message for record in caplog.records)


# ---- D2: a clip's length is known before it is decoded, and decoding is bounded ------------------------------


def test_clip_duration_is_checked_from_the_header_before_decoding(monkeypatch, tmp_path: Path) -> None:
    long_clip = tmp_path / "long.wav"
    soundfile.write(long_clip, np.zeros(16000 * 5, dtype=np.float32), 16000)
    monkeypatch.setattr(soundfile.SoundFile, "read", _no_decoding)
    with pytest.raises(ClipTooLongError, match=r"5\.0 s"):
        load_clip(long_clip.read_bytes(), 16000, max_seconds=2.0)


def _no_decoding(*args: object, **kwargs: object) -> None:
    raise AssertionError("decoded a clip whose header says it is too long")


def flac_of_unknown_length(seconds: float, rate: int = 16000) -> bytes:
    """A FLAC whose STREAMINFO does not give its length (total samples 0, as a streaming encoder writes)."""
    buffer = io.BytesIO()
    soundfile.write(buffer, np.zeros(int(seconds * rate), dtype=np.int16), rate, format="FLAC")
    data = bytearray(buffer.getvalue())
    assert data[:4] == b"fLaC"
    data[21] &= 0xF0  # the 36-bit total-samples field: 4 bits here and the next 4 bytes
    data[22:26] = bytes(4)
    return bytes(data)


def test_decoding_stops_at_the_limit_when_the_header_has_no_length(monkeypatch) -> None:
    reads: list[int] = []
    original = soundfile.SoundFile.read

    def counting_read(self, frames=-1, *args, **kwargs):
        block = original(self, frames, *args, **kwargs)
        reads.append(len(block))
        return block

    monkeypatch.setattr(soundfile.SoundFile, "read", counting_read)
    with pytest.raises(ClipTooLongError, match="more than the limit"):
        load_clip(flac_of_unknown_length(40.0), 16000, max_seconds=2.0)
    assert sum(reads) <= 2 * 16000 + max(reads)


def test_files_decode_as_before_in_blocks(tmp_path: Path) -> None:
    """Block decoding with a streaming resampler equals decoding and resampling the whole clip at once."""
    import soxr

    rng = np.random.default_rng(0)
    stereo = (0.1 * rng.standard_normal((44100 * 3, 2))).astype(np.float32)
    path = tmp_path / "stereo.wav"
    soundfile.write(path, stereo, 44100, subtype="FLOAT")
    expected = soxr.resample(stereo.mean(axis=1, dtype=np.float32), 44100, 16000, quality="VHQ")
    np.testing.assert_array_equal(load_clip(path, 16000), expected.astype(np.float32))
    np.testing.assert_array_equal(load_clip(path.read_bytes(), 44100), stereo.mean(axis=1, dtype=np.float32))


_BOMB_SCRIPT = textwrap.dedent(
    """
    import resource, sys
    from voxwire.audio.clip import ClipTooLongError, load_clip
    data = open(sys.argv[1], "rb").read()
    idle = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        load_clip(data, 48000, max_seconds=30.0)
    except ClipTooLongError:
        pass
    else:
        raise SystemExit("the bomb was accepted")
    print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - idle) / 1024)
    """
)


def test_a_decompression_bomb_costs_no_memory(tmp_path: Path) -> None:
    """The probe's bomb: a FLAC of 60 minutes of silence (a few hundred KB). Peak RSS is measured in a fresh
    process (``ru_maxrss``, which sees every allocation, libsndfile's and soxr's included)."""
    bomb = tmp_path / "silence.flac"
    rate, block = 16000, np.zeros(16000 * 60, dtype=np.int16)
    with soundfile.SoundFile(bomb, "w", rate, 1, format="FLAC", subtype="PCM_16") as sound:
        for _ in range(60):
            sound.write(block)
    assert bomb.stat().st_size < 2 * 1024 * 1024
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-c", _BOMB_SCRIPT, str(bomb)], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert float(result.stdout) < 100.0, f"peak grew by {result.stdout.strip()} MB"


@pytest.mark.asyncio
async def test_an_upload_too_long_by_its_header_is_refused(client: TestClient, tmp_path: Path) -> None:
    buffer = io.BytesIO()
    soundfile.write(buffer, np.zeros(16000 * 40, dtype=np.int16), 16000, format="FLAC")
    status, body = await upload(client, buffer.getvalue(), transcript="Silence.")
    assert (status, body["error"]["code"]) == (400, "clip_too_long"), body
    assert "40.0 s" in body["error"]["message"]


# ---- D3: every text field has a limit, checked before any work ----------------------------------------------


@pytest.mark.parametrize(
    ("field", "limit_name"), [("transcript", "max_transcript_chars"), ("name", "max_voice_name_chars")]
)
@pytest.mark.asyncio
async def test_oversized_text_fields_are_refused_before_any_work(
    serve, aiohttp_client, monkeypatch, field: str, limit_name: str
) -> None:
    client = await aiohttp_client(await serve(**{limit_name: 100}))
    import voxwire.serving.http.clips as clips  # where every client's clip is decoded

    monkeypatch.setattr(clips, "load_clip", _no_decoding)
    started = time.perf_counter()
    status, body = await upload(client, clip(), **{field: "word " * 180_000})  # the probe's 900 KB
    assert (status, body["error"]["code"]) == (400, "text_too_long"), body
    assert time.perf_counter() - started < 5.0
    status, body = await upload(client, clip(), **{field: "x" * 101})
    assert (status, body["error"]["code"]) == (400, "text_too_long"), body


# ---- D10: loading never breaks on a bad file, and leftovers are cleaned -------------------------------------


@pytest.mark.parametrize(
    "change",
    [
        {"created_at": "yesterday"},
        {"duration_s": "long"},
        {"name": None},
        {"transcript": 5},
        {"owner": ["a"]},
        {"colour": "red"},
    ],
)
@pytest.mark.asyncio
async def test_voices_with_a_bad_field_are_skipped_and_the_listing_works(
    serve, aiohttp_client, tmp_path: Path, change: dict
) -> None:
    voices_dir = tmp_path / "voices"
    first = await aiohttp_client(await serve(voices_dir=voices_dir))
    good = (await upload(first, clip(0.5), name="good"))[1]
    bad = (await upload(first, clip(0.5), name="bad"))[1]
    await first.close()
    meta = voices_dir / f"{bad['id']}.json"
    meta.write_text(json.dumps({**json.loads(meta.read_text()), **change}))

    second = await aiohttp_client(await serve(voices_dir=voices_dir))
    async with second.get("/v1/voices") as response:
        assert response.status == 200
        assert [voice["id"] for voice in (await response.json())["data"] if not voice["builtin"]] == [good["id"]]


@pytest.mark.asyncio
async def test_leftovers_of_interrupted_writes_are_removed_at_start(tmp_path: Path) -> None:
    store = VoiceStore(tmp_path, "m", (2, 4), max_voices=10)
    kept = await store.add(VoicePrompt("words", torch.randn(3, 2, 4)), name="kept", duration_s=1.0)
    stale = [tmp_path / ".voice_0123456789abcdef.json.99.tmp", tmp_path / "voice_0123456789abcdef.safetensors"]
    fresh = tmp_path / ".voice_fedcba9876543210.safetensors.98.tmp"  # another process may be writing it now
    unrelated = tmp_path / "notes.txt"
    for path in (*stale, fresh, unrelated):
        path.write_bytes(b"partial")
    old = time.time() - ORPHAN_GRACE_S - 1
    for path in stale:
        os.utime(path, (old, old))

    VoiceStore(tmp_path, "m", (2, 4), max_voices=10).load()
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(
        [f"{kept.id}.json", f"{kept.id}.safetensors", fresh.name, unrelated.name]
    )


# ---- D12: names and ownership -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["two\nlines", "bell\x07", "esc\x1b[31mred", "rtl\u202eevil", "nul\x00"])
@pytest.mark.asyncio
async def test_voice_names_refuse_control_characters(client: TestClient, name: str) -> None:
    status, body = await upload(client, clip(0.5), name=name)
    assert (status, body["error"]["code"]) == (400, "invalid_name"), body


@pytest.mark.asyncio
async def test_only_the_key_that_made_a_voice_deletes_it(serve, aiohttp_client) -> None:
    client = await aiohttp_client(await serve(api_keys=("alice-key", "bob-key")))
    alice, bob = {"Authorization": "Bearer alice-key"}, {"Authorization": "Bearer bob-key"}
    async with client.post("/v1/voices", data=_form(), headers=alice) as response:
        voice = await response.json()
        assert response.status == 201, voice
        assert "owner" not in voice
    async with client.delete(f"/v1/voices/{voice['id']}", headers=bob) as response:
        assert (response.status, (await response.json())["error"]["code"]) == (403, "forbidden")
    assert await speak_with_key(client, voice["id"], bob) == 200  # using a voice is not owning it
    async with client.delete(f"/v1/voices/{voice['id']}", headers=alice) as response:
        assert response.status == 200


def _form():
    return form(clip(0.5))


async def speak_with_key(client: TestClient, voice: str, headers: dict[str, str]) -> int:
    body = {"model": "m", "input": "In my voice.", "voice": voice, "response_format": "pcm", "seed": 1}
    async with client.post("/v1/audio/speech", json=body, headers=headers) as response:
        await response.read()
        return response.status


@pytest.mark.asyncio
async def test_voices_made_without_keys_stay_deletable(client: TestClient) -> None:
    status, voice = await upload(client, clip(0.5))
    assert status == 201
    assert await speak_with(client, voice["id"]) == 200
    async with client.delete(f"/v1/voices/{voice['id']}") as response:
        assert response.status == 200
