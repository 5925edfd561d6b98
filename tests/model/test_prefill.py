"""LocEnc in the prefill: a batch without audio never reaches it, and a runner's voice encodings (LocEnc over the
voice's own patches only) stand in for it, giving each row what the reference's full-length encoding gives."""

from __future__ import annotations

import dataclasses

import torch

import voxwire
from voxwire.model.kv_cache import KVCache
from voxwire.model.voxcpm import PrefillBatch
from voxwire.prompt import VoicePrompt
from voxwire.sequence import build_sequence
from voxwire.tiny.checkpoint import make_tiny_checkpoint


@torch.inference_mode()
def test_locenc_runs_only_where_there_is_audio(tmp_path) -> None:
    tts = voxwire.load_model(make_tiny_checkpoint(tmp_path / "v2", "voxcpm2"), device="cpu")
    config, model = tts.config, tts.model
    patches = torch.randn(3, config.patch_size, config.feat_dim, generator=torch.Generator().manual_seed(0))
    zero_shot = build_sequence(tts.tokenizer, config, "A zero-shot row, a little longer than the other.", None)
    voiced = build_sequence(tts.tokenizer, config, "Hi.", VoicePrompt("Clip.", patches[:2], patches[2:]))
    encoded: list[int] = []
    hook = model.feat_encoder.register_forward_hook(
        lambda module, args, output: encoded.append(args[0].shape[0] * args[0].shape[1])
    )

    def prefill(batch: PrefillBatch, rows: int):
        caches = [
            KVCache.dedicated(lm, rows, 256, tts.device, tts.dtype) for lm in (config.lm_config, config.residual_lm)
        ]
        return model.prefill(batch, *caches)

    try:
        prefill(PrefillBatch.from_sequences([zero_shot, zero_shot], tts.device, tts.dtype), 2)
        assert encoded == []  # no audio anywhere: LocEnc never runs
        batch = PrefillBatch.from_sequences([zero_shot, voiced], tts.device, tts.dtype)
        full = prefill(batch, 2)
        assert encoded == [2 * batch.feats.size(1)]  # as the reference: every position of the batch
        encoded.clear()
        # What a runner passes: the voice's 3 patches encoded by themselves.
        voice_encodings = model.encode_patches(voiced.feats[voiced.audio_mask.bool()])
        assert encoded == [3]
        encoded.clear()
        given = prefill(dataclasses.replace(batch, audio_encodings=voice_encodings), 2)
        assert encoded == []  # the prefill itself skips LocEnc
    finally:
        hook.remove()
    torch.testing.assert_close(given.lm_hidden, full.lm_hidden, atol=1e-5, rtol=0)
    torch.testing.assert_close(given.residual_hidden, full.residual_hidden, atol=1e-5, rtol=0)
    # Each row's state equals the row prefilled alone.
    for row, sequence in enumerate((zero_shot, voiced)):
        alone = prefill(PrefillBatch.from_sequences([sequence], tts.device, tts.dtype), 1)
        torch.testing.assert_close(full.lm_hidden[row], alone.lm_hidden[0], atol=1e-5, rtol=0)
        torch.testing.assert_close(full.residual_hidden[row], alone.residual_hidden[0], atol=1e-5, rtol=0)
