"""The prefill runs LocEnc only where there is audio: text and padding positions never reach it."""

from __future__ import annotations

import torch

import voxstream
from voxstream.model.kv_cache import KVCache
from voxstream.model.voxcpm import PrefillBatch
from voxstream.prompt import VoicePrompt, build_sequence
from voxstream.tiny.checkpoint import make_tiny_checkpoint


@torch.inference_mode()
def test_locenc_runs_on_audio_positions_only(tmp_path) -> None:
    tts = voxstream.load_model(make_tiny_checkpoint(tmp_path / "v2", "voxcpm2"), device="cpu")
    config = tts.config
    patches = torch.randn(3, config.patch_size, config.feat_dim, generator=torch.Generator().manual_seed(0))
    sequences = [
        build_sequence(tts.tokenizer, config, "A zero-shot row, a little longer than the other.", None),
        build_sequence(tts.tokenizer, config, "Hi.", VoicePrompt("Clip.", patches[:2], patches[2:])),
    ]
    batch = PrefillBatch.from_sequences(sequences, tts.device, tts.dtype)
    caches = [KVCache.dedicated(lm, 2, 256, tts.device, tts.dtype) for lm in (config.lm_config, config.residual_lm)]
    encoded: list[int] = []
    hook = tts.model.feat_encoder.register_forward_hook(
        lambda module, args, output: encoded.append(args[0].shape[0] * args[0].shape[1])
    )
    try:
        batched = tts.model.prefill(batch, *caches)
    finally:
        hook.remove()
    assert encoded == [3]  # the voice's 2 prompt and 1 reference patches; not the batch's 2 x T positions
    # Each row's state equals the row prefilled alone.
    for row, sequence in enumerate(sequences):
        alone = [KVCache.dedicated(lm, 1, 256, tts.device, tts.dtype) for lm in (config.lm_config, config.residual_lm)]
        state = tts.model.prefill(PrefillBatch.from_sequences([sequence], tts.device, tts.dtype), *alone)
        torch.testing.assert_close(batched.lm_hidden[row], state.lm_hidden[0], atol=1e-5, rtol=0)
        torch.testing.assert_close(batched.residual_hidden[row], state.residual_hidden[0], atol=1e-5, rtol=0)
