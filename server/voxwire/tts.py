"""``VoxCPM``: a loaded model (``voxwire.model.loaded.LoadedModel``) with voice encoding and the one-utterance API.

``generate`` and ``stream`` run the same batched ``prefill`` and ``decode_step`` the engine runs, at
batch size 1, and decode audio with the exact streaming VAE decoder, so their output is the
reference's non-streaming audio, chunk by chunk. Calls are independent (each allocates the KV cache its
utterance needs), but they share the model's compute: the engine serves concurrent sessions.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from voxwire import devices
from voxwire.audio.clip import AudioSource, load_clip
from voxwire.chunk import Chunk
from voxwire.errors import InvalidInputError
from voxwire.finish_reason import FinishReason
from voxwire.model.cfm import CfmSchedule
from voxwire.model.kv_cache import KVCache
from voxwire.model.loaded import LoadedModel
from voxwire.model.lora import load_lora
from voxwire.model.voxcpm import PrefillBatch, VoxCPMModel
from voxwire.model_config import ModelConfig
from voxwire.params import SynthesisParams
from voxwire.prompt import VoicePrompt
from voxwire.sampling import NoiseStream, random_seed
from voxwire.sequence import InputSequence, build_sequence, sequence_length_cap
from voxwire.text.tokenizer import TextTokenizer
from voxwire.voice_clip import VoiceClip

REFERENCE_RETRY_MAX_TIMES = 3
"""The reference's ``retry_badcase_max_times`` default: the one value ``generate`` accepts (it never retries)."""
REFERENCE_RETRY_RATIO = 6.0
"""The reference's ``retry_badcase_ratio_threshold`` default: the one value ``generate`` accepts."""


class VoxCPM(LoadedModel):
    """A loaded model with the one-utterance API: personas by name or directory, voice prompts, ``generate``
    and ``stream``."""

    def __init__(self, config: ModelConfig, model: VoxCPMModel, tokenizer: TextTokenizer, name: str) -> None:
        super().__init__(config, model, tokenizer, name)
        self._voice_stream: torch.cuda.Stream | None = None
        self._voice_stream_lock = threading.Lock()

    # ---- personas (LoRA adapters) ----
    def load_persona(self, name: str, directory: str | os.PathLike[str]) -> None:
        """Load a LoRA checkpoint directory (the reference's format) as persona ``name`` (its rank is checked
        against the bank's ``max_rank`` before its weights are read)."""
        bank = self.enable_personas()
        bank.register(name, load_lora(directory, self.model, bank.max_rank))

    def _persona_name(self, lora: str | os.PathLike[str]) -> str:
        """A registered persona's name, or a checkpoint directory (registered under its resolved path)."""
        bank = self.enable_personas()
        if isinstance(lora, str) and lora in bank.adapters:
            return lora
        name = str(Path(lora).resolve())
        if name not in bank.adapters:
            self.load_persona(name, name)
        return name

    @contextmanager
    def _persona(self, lora: str | os.PathLike[str] | None) -> Iterator[torch.Tensor | None]:
        """The one-row persona index for this utterance (None without one), held for its duration."""
        if lora is None:
            yield None
            return
        name = self._persona_name(lora)
        bank = self.enable_personas()
        slot = bank.acquire(name)
        try:
            yield torch.tensor([slot], device=self.device)
        finally:
            bank.release(name)

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
        cuda = devices.cuda_device(self.device)
        # Called from any thread, with the model's device current, on a stream of its own: the engine's steps run
        # on the default stream, and neither waits for the other (the read back waits for this stream alone).
        with devices.scope(cuda), devices.on_stream(self._encode_stream(cuda)):
            latents = vae.encode(samples.unsqueeze(0).to(self.device))[0]  # (D, frames)
            return latents.view(vae.latent_dim, -1, self.config.patch_size).permute(1, 2, 0).float().cpu()

    def _encode_stream(self, cuda: torch.device | None) -> torch.cuda.Stream | None:
        """The stream voice encoding runs on (``devices.side_stream``), made at the first encode; None off CUDA."""
        if cuda is not None and self._voice_stream is None:
            with self._voice_stream_lock:
                if self._voice_stream is None:
                    self._voice_stream = devices.side_stream(cuda)
        return self._voice_stream

    def make_prompt(self, clip: VoiceClip) -> VoicePrompt:
        """Encode a voice once. Prompt text + audio: continuation prompt (the transcript of the clip); a reference
        clip (voxcpm2): isolated cloning; both together are allowed on voxcpm2."""
        if clip.reference_audio is not None and not self.config.reference_cloning:
            raise InvalidInputError("reference audio (isolated voice cloning) needs a voxcpm2 model")
        if clip.text is not None and not clip.text.strip():
            raise InvalidInputError("prompt text must not be empty")
        return VoicePrompt(
            text=clip.text or "",
            audio_patches=None
            if clip.audio is None
            else self.encode_audio(clip.audio, clip.sample_rate, pad="left").numpy(),
            reference_patches=None
            if clip.reference_audio is None
            else self.encode_audio(clip.reference_audio, clip.reference_sample_rate, pad="right").numpy(),
        )

    @contextmanager
    def _selecting(self, persona: torch.Tensor | None) -> Iterator[None]:
        """Around one model call: the adapted layers read this utterance's persona index. The bank's lock
        keeps an engine step (which holds it) or another utterance from changing the index meanwhile."""
        bank = self.personas
        if bank is None:
            yield
            return
        with bank.lock:
            bank.rows.index = persona
            yield

    # ---- one utterance ----
    def generate(
        self,
        text: str,
        params: SynthesisParams | None = None,
        *,
        prompt: VoicePrompt | None = None,
        progress: bool = False,
        lora: str | os.PathLike[str] | None = None,
        prompt_wav_path: AudioSource | None = None,
        prompt_text: str | None = None,
        reference_wav_path: AudioSource | None = None,
        cfg_value: float | None = None,
        inference_timesteps: int | None = None,
        min_len: int | None = None,
        max_len: int | None = None,
        seed: int | None = None,
        normalize: bool = False,
        denoise: bool = False,
        retry_badcase: bool = True,
        retry_badcase_max_times: int = REFERENCE_RETRY_MAX_TIMES,
        retry_badcase_ratio_threshold: float = REFERENCE_RETRY_RATIO,
    ) -> np.ndarray:
        """Synthesize ``text``; returns float32 samples at ``sample_rate``. ``params``: the generation settings
        (None: ``SynthesisParams()``, the reference's defaults, a fresh seed). ``lora``: a persona registered
        with ``load_persona``, or a LoRA checkpoint directory in the reference's format.

        The reference's ``VoxCPM.generate`` keywords are accepted too (``generate_streaming`` says how each is
        read), so ``generate(text=..., prompt_wav_path=..., prompt_text=..., cfg_value=...)`` works as there.
        """
        chunks = self.generate_streaming(
            text, params, prompt=prompt, progress=progress, lora=lora, prompt_wav_path=prompt_wav_path,
            prompt_text=prompt_text, reference_wav_path=reference_wav_path, cfg_value=cfg_value,
            inference_timesteps=inference_timesteps, min_len=min_len, max_len=max_len, seed=seed,
            normalize=normalize, denoise=denoise, retry_badcase=retry_badcase,
            retry_badcase_max_times=retry_badcase_max_times,
            retry_badcase_ratio_threshold=retry_badcase_ratio_threshold,
        )  # fmt: skip
        return np.concatenate(list(chunks))

    def generate_streaming(
        self,
        text: str,
        params: SynthesisParams | None = None,
        *,
        prompt: VoicePrompt | None = None,
        progress: bool = False,
        lora: str | os.PathLike[str] | None = None,
        prompt_wav_path: AudioSource | None = None,
        prompt_text: str | None = None,
        reference_wav_path: AudioSource | None = None,
        cfg_value: float | None = None,
        inference_timesteps: int | None = None,
        min_len: int | None = None,
        max_len: int | None = None,
        seed: int | None = None,
        normalize: bool = False,
        denoise: bool = False,
        retry_badcase: bool = True,
        retry_badcase_max_times: int = REFERENCE_RETRY_MAX_TIMES,
        retry_badcase_ratio_threshold: float = REFERENCE_RETRY_RATIO,
    ) -> Iterator[np.ndarray]:
        """``generate``'s audio, one float32 array per patch as it is decoded (the reference's
        ``generate_streaming``: the arrays concatenate to ``generate``'s audio). Errors surface at the call.

        The reference's keywords: ``cfg_value``, ``inference_timesteps``, ``min_len``, ``max_len`` and ``seed``
        (voxwire's: the reference seeds with ``torch.manual_seed``) make the ``SynthesisParams``, unset ones at
        its defaults (not with ``params``); ``prompt_wav_path`` with ``prompt_text`` (a continuation prompt) and
        ``reference_wav_path`` (a reference clip, VoxCPM2) make the voice (not with ``prompt``);
        ``normalize=True`` reads numbers, dates and money as words (the ``normalize`` extra). There are no
        bad-case retries (docs/correctness.md), so ``retry_badcase`` is accepted either way and its two limits
        only at their defaults; there is no denoiser, so ``denoise`` only as False.

        Raises:
            TypeError: settings given both as ``params`` and as keywords, or a voice both as ``prompt`` and as
                clip paths.
            InvalidInputError: a keyword voxwire cannot honour (named), or a bad value or clip.
        """
        # Any: each value goes to the SynthesisParams field of its name, which checks it
        keywords: dict[str, Any] = {"cfg_value": cfg_value, "inference_timesteps": inference_timesteps,
                                    "min_len": min_len, "max_len": max_len, "seed": seed}  # fmt: skip
        given = {name: value for name, value in keywords.items() if value is not None}
        if params is not None and given:
            raise TypeError(f"give the generation settings as params or as keywords, not both: {sorted(given)}")
        clip_paths = {"prompt_wav_path": prompt_wav_path, "prompt_text": prompt_text,
                      "reference_wav_path": reference_wav_path}  # fmt: skip
        given_clips = sorted(name for name, value in clip_paths.items() if value is not None)
        if prompt is not None and given_clips:
            raise TypeError(f"give the voice as prompt or as clip paths, not both: {given_clips}")
        if denoise:
            raise InvalidInputError("denoise=True is not supported: voxwire has no denoiser; give a clean clip")
        for name, value, default in (
            ("retry_badcase_max_times", retry_badcase_max_times, REFERENCE_RETRY_MAX_TIMES),
            ("retry_badcase_ratio_threshold", retry_badcase_ratio_threshold, REFERENCE_RETRY_RATIO),
        ):
            if value != default:
                raise InvalidInputError(
                    f"{name}={value!r} is not supported: voxwire never retries a bad case (only {default!r} is "
                    "accepted, the reference's default)"
                )
        if params is None:
            params = dataclasses.replace(SynthesisParams(), **given)
        if given_clips:
            clip = VoiceClip(text=prompt_text, audio=prompt_wav_path, reference_audio=reference_wav_path)
            prompt = self.make_prompt(clip)
        if normalize:
            from voxwire.text.normalize import normalize as normalized

            text = normalized(text)
        chunks = self.stream(text, params, prompt=prompt, progress=progress, lora=lora)
        return (chunk.audio for chunk in chunks)

    def stream(
        self,
        text: str,
        params: SynthesisParams | None = None,
        *,
        prompt: VoicePrompt | None = None,
        progress: bool = False,
        lora: str | os.PathLike[str] | None = None,
    ) -> Iterator[Chunk]:
        """Like ``generate``, yielding each patch's audio as soon as it is decoded, with its latent patch (what a
        continuation prompt is made of); the last chunk says why the utterance ended (stop head or length cap)."""
        params = SynthesisParams() if params is None else params
        sequence = build_sequence(self.tokenizer, self.config, text, prompt)
        if lora is not None:
            self._persona_name(lora)  # load errors surface here, not at the first chunk
        seed = random_seed() if params.seed is None else params.seed
        return self._run(sequence, params, seed, progress, lora)

    @torch.inference_mode()
    def _run(
        self,
        sequence: InputSequence,
        params: SynthesisParams,
        seed: int,
        progress: bool,
        lora: str | os.PathLike[str] | None,
    ) -> Iterator[Chunk]:
        with self._persona(lora) as persona:
            # With the model's device current while it computes (fused ops launch on the current device, which is
            # cuda:0 on a fresh thread), and the caller's between chunks.
            yield from devices.scoped(
                devices.cuda_device(self.device), self._decode(sequence, params, seed, progress, persona)
            )

    def _decode(
        self, sequence: InputSequence, params: SynthesisParams, seed: int, progress: bool, persona: torch.Tensor | None
    ) -> Generator[Chunk, None, None]:
        cap = sequence_length_cap(sequence, params.max_len, self.config.max_length)
        # A cache exactly as long as this utterance can get.
        base, residual = (
            KVCache.dedicated(lm, 1, sequence.length + cap, self.device, self.dtype)
            for lm in (self.config.lm_config, self.config.residual_lm)
        )
        with self._selecting(persona):
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
            with self._selecting(persona):
                patch, stop_logits = self.model.decode_step(state, base, residual, noise.next(), cfg, schedule)
            audio = self.vae_decoder.decode(patch.float().transpose(1, 2), vae_state)
            stopped = step > params.min_len and bool(stop_logits.argmax(dim=-1)[0] == 1)
            finish = FinishReason.STOP if stopped else FinishReason.LENGTH if step + 1 == cap else None
            yield Chunk("", audio[0].cpu().numpy(), finish, patch=patch[0].float().cpu().numpy())
            if stopped:
                return
