"""``VoxCPM``: a loaded model with its tokenizer, voice encoding and the one-utterance API.

``generate`` and ``stream`` run the same batched ``prefill`` and ``decode_step`` the engine runs, at
batch size 1, and decode audio with the exact streaming VAE decoder, so their output is the
reference's non-streaming audio, chunk by chunk. Calls are independent (each allocates the KV cache its
utterance needs), but they share the model's compute: the engine serves concurrent sessions.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from voxstream.audio.clip import AudioSource, load_clip
from voxstream.config import ModelConfig
from voxstream.errors import InvalidInputError
from voxstream.model.audio_vae import StreamingVAEDecoder
from voxstream.model.cfm import CfmSchedule
from voxstream.model.kv_cache import KVCache
from voxstream.model.voxcpm import PrefillBatch, VoxCPMModel
from voxstream.params import SynthesisParams
from voxstream.prompt import InputSequence, VoicePrompt, build_sequence, sequence_length_cap
from voxstream.sampling import NoiseStream, random_seed
from voxstream.text.tokenizer import TextTokenizer


@dataclass(frozen=True)
class Chunk:
    """One generated patch and its audio."""

    audio: np.ndarray  # (samples_per_patch,) float32 at the model's sample rate
    patch: torch.Tensor  # (P, D) float32 latent patch (what a continuation prompt is made of)
    stopped: bool  # True on the last chunk when the stop head ended the utterance (False: length cap)


class VoxCPM:
    def __init__(self, config: ModelConfig, model: VoxCPMModel, tokenizer: TextTokenizer, name: str) -> None:
        self.config = config
        self.model = model.eval().requires_grad_(False)
        self.tokenizer = tokenizer
        self.name = name
        self.device = next(model.parameters()).device
        self.dtype = model.base_lm.norm.weight.dtype
        self.vae_decoder = StreamingVAEDecoder(model.audio_vae)

    def cast(self, dtype: torch.dtype) -> None:
        """Switch the transformer parts to ``dtype`` (the VAE stays float32); only between utterances."""
        self.model.cast_transformers(dtype)
        self.dtype = dtype

    @property
    def sample_rate(self) -> int:
        return self.config.sample_rate

    @property
    def samples_per_patch(self) -> int:
        return self.config.samples_per_patch

    # ---- voices ----
    @torch.inference_mode()
    def encode_audio(self, source: AudioSource, sample_rate: int | None = None, pad: str = "left") -> torch.Tensor:
        """Audio -> latent patches (N, P, D) float32, padded with silence to whole patches on the ``pad`` side
        (left for continuation prompts, right for v2 reference clips, as the reference does)."""
        vae = self.model.audio_vae
        samples = torch.from_numpy(load_clip(source, vae.sample_rate, sample_rate))
        patch_samples = self.config.patch_size * vae.encoder_hop
        missing = -samples.numel() % patch_samples
        samples = torch.nn.functional.pad(samples, (missing, 0) if pad == "left" else (0, missing))
        latents = vae.encode(samples.unsqueeze(0).to(self.device))[0]  # (D, frames)
        return latents.view(vae.latent_dim, -1, self.config.patch_size).permute(1, 2, 0).float().cpu()

    def make_prompt(
        self,
        *,
        text: str | None = None,
        audio: AudioSource | None = None,
        sample_rate: int | None = None,
        reference_audio: AudioSource | None = None,
        reference_sample_rate: int | None = None,
    ) -> VoicePrompt:
        """Encode a voice once. ``text`` + ``audio``: continuation prompt (the transcript of the clip);
        ``reference_audio`` (voxcpm2): isolated cloning; both together are allowed on voxcpm2."""
        if (text is None) != (audio is None):
            raise InvalidInputError("prompt text and prompt audio must be given together")
        if reference_audio is not None and not self.config.reference_cloning:
            raise InvalidInputError("reference audio (isolated voice cloning) needs a voxcpm2 model")
        if audio is None and reference_audio is None:
            raise InvalidInputError("give prompt text and audio, or reference audio")
        if text is not None and not text.strip():
            raise InvalidInputError("prompt text must not be empty")
        return VoicePrompt(
            text=text or "",
            audio_patches=None if audio is None else self.encode_audio(audio, sample_rate, pad="left"),
            reference_patches=None
            if reference_audio is None
            else self.encode_audio(reference_audio, reference_sample_rate, pad="right"),
        )

    # ---- one utterance ----
    def generate(
        self,
        text: str,
        *,
        prompt: VoicePrompt | None = None,
        seed: int | None = None,
        cfg_value: float = 2.0,
        inference_timesteps: int = 10,
        min_len: int = 2,
        max_len: int = 4096,
        progress: bool = False,
    ) -> np.ndarray:
        """Synthesize ``text``; returns float32 samples at ``sample_rate``."""
        chunks = self.stream(
            text,
            prompt=prompt,
            seed=seed,
            cfg_value=cfg_value,
            inference_timesteps=inference_timesteps,
            min_len=min_len,
            max_len=max_len,
            progress=progress,
        )
        return np.concatenate([chunk.audio for chunk in chunks])

    def stream(
        self,
        text: str,
        *,
        prompt: VoicePrompt | None = None,
        seed: int | None = None,
        cfg_value: float = 2.0,
        inference_timesteps: int = 10,
        min_len: int = 2,
        max_len: int = 4096,
        progress: bool = False,
    ) -> Iterator[Chunk]:
        """Like ``generate``, yielding each patch's audio as soon as it is decoded."""
        params = SynthesisParams(cfg_value, inference_timesteps, min_len, max_len, seed)
        sequence = build_sequence(self.tokenizer, self.config, text, prompt)
        return self._run(sequence, params, random_seed() if seed is None else seed, progress)

    @torch.inference_mode()
    def _run(self, sequence: InputSequence, params: SynthesisParams, seed: int, progress: bool) -> Iterator[Chunk]:
        cap = sequence_length_cap(sequence, params.max_len, self.config.max_length)
        # A cache exactly as long as this utterance can get.
        base, residual = (
            KVCache.dedicated(lm, 1, sequence.length + cap, self.device, self.dtype)
            for lm in (self.config.lm_config, self.config.residual_lm)
        )
        state = self.model.prefill(PrefillBatch.from_sequences([sequence], self.device, self.dtype), base, residual)
        vae_state = self.vae_decoder.new_state(1)
        self.vae_decoder.warm(sequence.decode_context, self.dtype, vae_state)
        noise = NoiseStream(seed, self.config.feat_dim, self.config.patch_size, self.dtype, self.device)
        schedule = CfmSchedule.build([params.inference_timesteps], self.dtype, self.device)
        cfg = torch.tensor([params.cfg_value], dtype=torch.float32, device=self.device)
        steps = range(cap)
        if progress:
            from tqdm import tqdm

            steps = tqdm(steps, desc="patches", unit="patch")
        for step in steps:
            patch, stop_logits = self.model.decode_step(state, base, residual, noise.next(), cfg, schedule)
            audio = self.vae_decoder.decode(patch.float().transpose(1, 2), vae_state)
            stopped = step > params.min_len and bool(stop_logits.argmax(dim=-1)[0] == 1)
            yield Chunk(audio[0].cpu().numpy(), patch[0].float().cpu(), stopped)
            if stopped:
                return
