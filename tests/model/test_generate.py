"""The one-utterance API as a user sees it: seeds, streaming, voices, batching of the model functions."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch

import voxwire
from voxwire.errors import InvalidInputError
from voxwire.finish_reason import FinishReason
from voxwire.model.cfm import CfmSchedule
from voxwire.model.kv_cache import KVCache
from voxwire.model.voxcpm import PrefillBatch
from voxwire.params import SynthesisParams
from voxwire.sampling import NoiseStream
from voxwire.sequence import build_sequence
from voxwire.tiny.checkpoint import make_tiny_checkpoint
from voxwire.tts import VoxCPM
from voxwire.voice_clip import VoiceClip


@pytest.fixture
def v2(tiny_tts: VoxCPM) -> VoxCPM:
    return tiny_tts


@pytest.fixture(scope="module")
def v1(tmp_path_factory: pytest.TempPathFactory) -> VoxCPM:
    return voxwire.load_model(make_tiny_checkpoint(tmp_path_factory.mktemp("v1"), "voxcpm-16k"), device="cpu")


@pytest.mark.isa
def test_same_seed_same_audio_other_seed_other_audio(v2: VoxCPM) -> None:
    first = v2.generate("A seeded sentence.", SynthesisParams(seed=7, max_len=8))
    assert np.array_equal(first, v2.generate("A seeded sentence.", SynthesisParams(seed=7, max_len=8)))
    other = v2.generate("A seeded sentence.", SynthesisParams(seed=8, max_len=8))
    assert first.shape != other.shape or not np.allclose(first, other)
    assert v2.generate("No seed given.", SynthesisParams(max_len=5)).size > 0


@pytest.mark.isa
def test_stream_yields_one_patch_per_chunk_and_equals_generate(v2: VoxCPM) -> None:
    chunks = list(v2.stream("Streaming equals offline.", SynthesisParams(seed=3, max_len=9)))
    assert all(c.audio.shape == (v2.samples_per_patch,) for c in chunks)
    assert all(c.finish_reason is None for c in chunks[:-1])
    assert chunks[-1].finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
    assert all(c.patch is not None and c.patch.shape == (v2.config.patch_size, v2.config.feat_dim) for c in chunks)
    full = v2.generate("Streaming equals offline.", SynthesisParams(seed=3, max_len=9))
    np.testing.assert_array_equal(np.concatenate([c.audio for c in chunks]), full)


def test_min_len_and_length_cap(v2: VoxCPM) -> None:
    capped = list(v2.stream("Hi.", SynthesisParams(seed=1, min_len=6, max_len=7)))
    assert len(capped) == 7 and capped[-1].finish_reason is FinishReason.LENGTH
    # "Hi." is few tokens: the reference's cap int(tokens * 6 + 10) binds before max_len.
    tokens = len(v2.tokenizer.encode("Hi."))
    uncapped = list(v2.stream("Hi.", SynthesisParams(seed=1, min_len=1000, max_len=4096)))
    assert len(uncapped) == int(tokens * 6 + 10) and uncapped[-1].finish_reason is FinishReason.LENGTH


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"cfg_value": float("nan")}, "cfg_value"),
        ({"inference_timesteps": 0}, "inference_timesteps"),
        ({"min_len": -1}, "min_len"),
        ({"max_len": 0}, "max_len"),
    ],
)
def test_bad_parameters_are_named(v2: VoxCPM, kwargs: dict, match: str) -> None:
    with pytest.raises(InvalidInputError, match=match):
        v2.generate("Hello.", SynthesisParams(seed=0, **kwargs))


def test_voice_prompts_from_files_and_arrays_at_any_rate(v2: VoxCPM, tmp_path: Path) -> None:
    rate = 22050
    clip = (0.3 * np.sin(2 * np.pi * 220 * np.arange(int(0.4 * rate)) / rate)).astype(np.float32)
    soundfile.write(str(tmp_path / "voice.flac"), np.stack([clip, clip], axis=1), rate)
    from_file = v2.make_prompt(VoiceClip(text="My voice.", audio=tmp_path / "voice.flac"))
    from_array = v2.make_prompt(VoiceClip(text="My voice.", audio=clip, sample_rate=rate))
    torch.testing.assert_close(from_file.audio_patches, from_array.audio_patches, atol=1e-3, rtol=0)
    # 0.4 s resampled to 16 kHz is 6400 samples: left-padded to 3 patches of 2560.
    assert from_file.audio_patches.shape == (3, 4, 64)
    both = v2.make_prompt(
        VoiceClip(text="My voice.", audio=clip, sample_rate=rate, reference_audio=clip, reference_sample_rate=rate)
    )
    for prompt in (from_file, both, v2.make_prompt(VoiceClip(reference_audio=clip, reference_sample_rate=rate))):
        assert v2.generate("Cloned.", SynthesisParams(seed=2, max_len=5), prompt=prompt).size > 0


def test_prompt_errors_are_typed(v1: VoxCPM, v2: VoxCPM, tmp_path: Path) -> None:
    clip = np.zeros(8000, dtype=np.float32)
    with pytest.raises(InvalidInputError, match="together"):
        v2.make_prompt(VoiceClip(text="only text"))
    with pytest.raises(InvalidInputError, match="voxcpm2"):
        v1.make_prompt(VoiceClip(reference_audio=clip, reference_sample_rate=16000))
    with pytest.raises(InvalidInputError, match="sample rate"):
        v2.make_prompt(VoiceClip(text="x", audio=clip))
    (tmp_path / "not-audio.wav").write_text("hello")
    with pytest.raises(InvalidInputError, match="cannot read"):
        v2.make_prompt(VoiceClip(text="x", audio=tmp_path / "not-audio.wav"))
    with pytest.raises(InvalidInputError, match="NaN"):
        v2.make_prompt(VoiceClip(text="x", audio=np.full(100, np.nan, dtype=np.float32), sample_rate=16000))


def test_continuation_across_utterances_keeps_the_voice(v1: VoxCPM) -> None:
    first = list(v1.stream("The first part.", SynthesisParams(seed=4, max_len=6)))
    prompt = v1.make_prompt(VoiceClip(text="Intro.", audio=np.zeros(3200, dtype=np.float32), sample_rate=16000))
    continued = prompt.continued("The first part.", torch.from_numpy(np.stack([c.patch for c in first])))
    sequence = build_sequence(v1.tokenizer, v1.config, "The second part.", continued)
    assert sequence.feats.shape[0] == sequence.tokens.shape[0]
    assert int(sequence.audio_mask.sum()) == prompt.audio_patches.shape[0] + len(first)
    assert v1.generate("The second part.", SynthesisParams(seed=5, max_len=6), prompt=continued).size > 0


@torch.inference_mode()
def test_prefill_and_step_rows_are_independent(v2: VoxCPM) -> None:
    """Three requests of different lengths, seeds, cfg values and timestep counts in one batch produce each
    request's patches exactly as it would alone (fp32): the property the batching engine builds on."""
    texts, seeds, cfgs, steps = (
        ["One.", "A longer second request here.", "中文 three."],
        [1, 2, 3],
        [2.0, 1.5, 3.0],
        [10, 4, 7],
    )
    config, model = v2.config, v2.model
    sequences = [build_sequence(v2.tokenizer, config, t, None) for t in texts]

    def run(indices: list[int], count: int) -> list[torch.Tensor]:
        batch = PrefillBatch.from_sequences([sequences[i] for i in indices], v2.device, v2.dtype)
        caches = [
            KVCache.dedicated(lm, len(indices), config.max_length, v2.device, v2.dtype)
            for lm in (config.lm_config, config.residual_lm)
        ]
        state = model.prefill(batch, *caches)
        noises = [NoiseStream(seeds[i], config.feat_dim, config.patch_size, v2.dtype, v2.device) for i in indices]
        schedule = CfmSchedule.build([steps[i] for i in indices], v2.dtype, v2.device)
        cfg = torch.tensor([cfgs[i] for i in indices])
        patches = []
        for _ in range(count):
            noise = torch.cat([n.next() for n in noises])
            patch, _ = model.decode_step(state, *caches, noise, cfg, schedule)
            patches.append(patch)
        return [torch.stack([p[row] for p in patches]) for row in range(len(indices))]

    together = run([0, 1, 2], 4)
    for index in range(3):
        alone = run([index], 4)[0]
        torch.testing.assert_close(together[index], alone, atol=1e-4, rtol=0)
