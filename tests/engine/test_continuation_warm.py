"""Continuation prompts warm the VAE at admission (issue 34, D5): the step's admissions warm together, in one
batch per context length, and each stream starts from exactly the state its own warm would give it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from voxwire.engine import Engine, EngineConfig, Request, RunnerOptions, SynthesisParams
from voxwire.engine.runner import ModelRunner
from voxwire.kernels.batch_invariant import batch_invariant
from voxwire.model.audio_vae import StreamingVAEDecoder, VAEStreamState
from voxwire.prompt import VoicePrompt
from voxwire.tts import VoxCPM

from .helpers import audio, run


def continuation(tts: VoxCPM, rid: str, seed: int, patches: int) -> Request:
    """A sentence continuing a stream: its prompt is the previous sentence's ``patches`` patches."""
    generator = torch.Generator().manual_seed(seed)
    shape = (patches, tts.config.patch_size, tts.config.feat_dim)
    prompt = VoicePrompt("The sentence before.", torch.randn(shape, generator=generator).numpy())
    return Request(rid, "And the next one.", SynthesisParams(seed=seed, max_len=5, min_len=4), prompt=prompt)


def test_continuation_admissions_of_one_step_run_one_warm(tts: VoxCPM, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three continuation prompts admitted together warm the VAE once, as a batch of three; a fourth with a shorter
    context (a one-patch prompt) warms in a batch of its own, as its context is shorter."""
    warms: list[tuple[int, int]] = []  # (streams, context patches) of each warm
    original = StreamingVAEDecoder.warm

    def counted(self: StreamingVAEDecoder, context: torch.Tensor, dtype: torch.dtype, state: VAEStreamState) -> None:
        warms.append((state.batch_size, context.shape[-3]))
        original(self, context, dtype, state)

    monkeypatch.setattr(StreamingVAEDecoder, "warm", counted)
    engine = Engine(ModelRunner(tts, RunnerOptions(num_slots=4, max_length=256)), EngineConfig(max_running=4))
    for index in range(3):
        engine.add(continuation(tts, f"c{index}", seed=index, patches=8))
    engine.step()
    context = tts.config.decode_context_patches
    assert warms == [(3, context)]
    warms.clear()
    engine.add(continuation(tts, "short", seed=9, patches=1))
    engine.add(Request("zero-shot", "No prompt, no warm.", SynthesisParams(seed=3, max_len=5)))
    while engine.has_work():
        engine.step()
    assert warms == [(1, 1)]


@pytest.mark.isa
def test_a_batched_warm_leaves_each_stream_bit_for_bit_as_its_own_warm(tts: VoxCPM) -> None:
    """With batch-invariant numerics (as the runner warms with them on), the warm of three streams together and
    each stream warmed alone give the same state and the same audio after it, bit for bit. (The default numerics
    promise a session's audio within 1e-4 of its audio alone, batched warm or not.)"""
    decoder = tts.vae_decoder
    config = tts.config
    generator = torch.Generator().manual_seed(0)
    contexts = torch.randn(3, config.decode_context_patches, config.patch_size, config.feat_dim, generator=generator)
    latents = torch.randn(3, config.feat_dim, config.patch_size, generator=generator)
    with batch_invariant():
        together = decoder.new_state(3)
        decoder.warm(contexts, tts.dtype, together)
        warmed = [buffer.clone() for buffer in together.buffers]
        after = decoder.decode(latents, together)
        for row in range(3):
            alone = decoder.new_state(1)
            decoder.warm(contexts[row], tts.dtype, alone)
            for batched, own in zip(warmed, alone.buffers, strict=True):
                assert torch.equal(batched[row : row + 1], own)
            assert torch.equal(after[row : row + 1], decoder.decode(latents[row : row + 1], alone))


@pytest.mark.isa
def test_continuations_admitted_together_sound_bit_for_bit_as_alone(tts: VoxCPM) -> None:
    """With batch-invariant numerics, three continuation prompts admitted in one step (one warm of three) each give
    exactly the audio they give admitted alone (a warm of one)."""
    requests = [continuation(tts, f"c{index}", seed=index, patches=6) for index in range(3)]

    def engine() -> Engine:
        runner = ModelRunner(tts, RunnerOptions(num_slots=3, max_length=256, batch_invariant=True))
        return Engine(runner, EngineConfig(max_running=3))

    together = run(engine(), {0: requests})
    for request in requests:
        alone = run(engine(), {0: [request]})[request.request_id]
        assert np.array_equal(audio(together[request.request_id]), audio(alone)), request.request_id
