"""Voices and input sequences.

A ``VoicePrompt`` is a voice encoded once into latent patches and reused by any number of
utterances: a continuation prompt (transcript + audio, every version), a reference clip (isolated
cloning, ``voxcpm2`` only), or both. ``build_sequence`` lays a target text and a prompt out as the
model's input positions exactly as the reference does (spec section 4.3):

==========================  ==============================================================
mode                        positions
==========================  ==============================================================
zero-shot                   tok(text) 101
continuation                tok(prompt_text + text) 101 A[0..Np-1]
reference (v2)              103 R[0..Nr-1] 104 tok(text) 101
reference + continuation    103 R[0..Nr-1] 104 tok(prompt_text + text) 101 A[0..Np-1]
==========================  ==============================================================
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch

from voxwire.config import ModelConfig
from voxwire.errors import InvalidInputError
from voxwire.text.tokenizer import (
    AUDIO_START_ID,
    REF_AUDIO_END_ID,
    REF_AUDIO_START_ID,
    TextTokenizer,
    normalize_whitespace,
)

MAX_LATENT_MAGNITUDE = 1e3
"""Largest ``|value|`` of a prompt's latent patches accepted: VAE latents are O(10), and finite but huge ones
(3e38, say) drive the model to NaN or to silence up to the length cap."""


@dataclass(frozen=True)
class VoicePrompt:
    """A voice as latent patches, float32. Immutable: extend it with ``continued``."""

    text: str = ""
    audio_patches: torch.Tensor | None = None  # (Np, P, D) continuation audio, spoken as ``text``
    reference_patches: torch.Tensor | None = None  # (Nr, P, D) v2 reference clip

    def __post_init__(self) -> None:
        if self.audio_patches is None and self.text:
            raise InvalidInputError("a prompt transcript needs its prompt audio")
        if self.audio_patches is None and self.reference_patches is None:
            raise InvalidInputError("a voice prompt needs prompt audio, a reference clip, or both")
        # Every prompt is built here (encoded clips, voices read from disk, continuations), so this is the one
        # gate that keeps non-finite or absurd latents out of the model, where they would poison the batch row.
        for what, patches in (("prompt audio", self.audio_patches), ("reference", self.reference_patches)):
            if patches is None:
                continue
            if not bool(torch.isfinite(patches).all()):
                raise InvalidInputError(f"the {what} latents are not finite (the clip is not usable audio)")
            if patches.numel() and float(patches.abs().max()) > MAX_LATENT_MAGNITUDE:
                raise InvalidInputError(
                    f"the {what} latents reach |{float(patches.abs().max()):.3g}|, above {MAX_LATENT_MAGNITUDE:g} "
                    "(VAE latents are O(10): these are not an encoded clip)"
                )

    def __reduce__(self) -> tuple[object, tuple[str, np.ndarray | None, np.ndarray | None]]:
        # Pickled (the engine socket) as numpy arrays: a pickled tensor names torch.storage._load_from_bytes,
        # which would unpickle any bytes, so the engine protocol refuses it; rebuilding re-runs the gate above.
        return prompt_from_arrays, (self.text, _array(self.audio_patches), _array(self.reference_patches))

    @cached_property
    def digest(self) -> str:
        """A digest of the voice's patches (not of its transcript, which LocEnc never sees), computed once per
        voice object: what a runner's voice cache is keyed by."""
        digest = hashlib.blake2b(digest_size=16)
        for name, patches in (("reference", self.reference_patches), ("audio", self.audio_patches)):
            if patches is not None:
                values = patches.detach().to(device="cpu", dtype=torch.float32).contiguous()
                digest.update(f"{name}{tuple(values.shape)}".encode())
                digest.update(values.numpy().data)
        return digest.hexdigest()

    def continued(self, text: str, patches: torch.Tensor) -> VoicePrompt:
        """This voice followed by an utterance just generated (text and its (N, P, D) patches), so the next
        utterance continues the same voice. The reference clip, if any, is kept."""
        audio = patches if self.audio_patches is None else torch.cat([self.audio_patches, patches])
        return VoicePrompt(self.text + text, audio, self.reference_patches)


@dataclass(frozen=True)
class InputSequence:
    """One request's model input, before batching. Every audio position holds a patch of the request's voice,
    its reference clip first, then its prompt audio."""

    tokens: torch.Tensor  # (T,) long
    feats: torch.Tensor  # (T, P, D) float32
    text_mask: torch.Tensor  # (T,) float32
    audio_mask: torch.Tensor  # (T,) float32
    target_tokens: int  # token count of the target text alone (drives the length cap)
    decode_context: torch.Tensor  # (C, P, D) float32 patches that warm the VAE decoder (C may be 0)

    @property
    def length(self) -> int:
        return self.tokens.size(0)


def length_cap(target_tokens: int, max_len: int) -> int:
    """The reference's cap on generated patches: ``min(int(target_tokens * 6 + 10), max_len)``."""
    return min(int(target_tokens * 6.0 + 10), max_len)


def sequence_length_cap(sequence: InputSequence, max_len: int, max_length: int) -> int:
    """Patches a request may generate when its prompt and patches share ``max_length`` positions."""
    room = max_length - sequence.length
    if room < 1:
        raise InvalidInputError(
            f"the input takes {sequence.length} positions but the model holds {max_length}: "
            "shorten the text or the voice prompt"
        )
    # The reference would fail with "KV cache is full" past max_length; stop at the cache's end instead.
    return min(length_cap(sequence.target_tokens, max_len), room)


def build_sequence(
    tokenizer: TextTokenizer, config: ModelConfig, text: str, prompt: VoicePrompt | None
) -> InputSequence:
    if not isinstance(text, str) or not text.strip():
        raise InvalidInputError("text must be a non-empty string")
    if prompt is not None and prompt.reference_patches is not None and not config.reference_cloning:
        raise InvalidInputError("reference audio (isolated voice cloning) needs a voxcpm2 model")
    target = normalize_whitespace(text)
    target_tokens = len(tokenizer.encode(target))
    if target_tokens == 0:
        raise InvalidInputError("text has no speakable tokens")
    shape = (config.patch_size, config.feat_dim)
    parts: list[tuple[list[int], torch.Tensor, float]] = []  # (tokens, feats, is_text) segments
    if prompt is not None and prompt.reference_patches is not None:
        ref = _check_patches(prompt.reference_patches, shape, "reference")
        parts += [
            ([REF_AUDIO_START_ID], _zeros(1, shape), 1.0),
            ([0] * ref.size(0), ref, 0.0),
            ([REF_AUDIO_END_ID], _zeros(1, shape), 1.0),
        ]
    prompt_text = prompt.text if prompt is not None else ""
    tokens = [*tokenizer.encode(prompt_text + target), AUDIO_START_ID]
    parts.append((tokens, _zeros(len(tokens), shape), 1.0))
    if prompt is not None and prompt.audio_patches is not None:
        audio = _check_patches(prompt.audio_patches, shape, "prompt audio")
        parts.append(([0] * audio.size(0), audio, 0.0))
    token_ids = [t for ids, _, _ in parts for t in ids]
    is_text = torch.tensor([flag for ids, _, flag in parts for _ in ids])
    feats = torch.cat([f for _, f, _ in parts])
    audio_mask = 1.0 - is_text
    return InputSequence(
        tokens=torch.tensor(token_ids, dtype=torch.long),
        feats=feats,
        text_mask=is_text,
        audio_mask=audio_mask,
        target_tokens=target_tokens,
        decode_context=_decode_context(config, feats, audio_mask),
    )


def _decode_context(config: ModelConfig, feats: torch.Tensor, audio_mask: torch.Tensor) -> torch.Tensor:
    """The trailing audio patches the reference prepends before decoding, when the sequence ends in audio.

    v1 takes the last positions of the sequence; v2 takes the last audio positions, which for a one- or
    two-patch prompt reach back into the reference clip, exactly as the reference does.
    """
    if audio_mask[-1] != 1:
        return feats[:0]
    audio_positions = audio_mask.nonzero().squeeze(1)
    count = min(config.decode_context_patches, audio_positions.numel())
    return feats[audio_positions[-count:]]


def _zeros(count: int, shape: tuple[int, int]) -> torch.Tensor:
    return torch.zeros((count, *shape), dtype=torch.float32)


def _check_patches(patches: torch.Tensor, shape: tuple[int, int], what: str) -> torch.Tensor:
    if patches.dim() != 3 or tuple(patches.shape[1:]) != shape or patches.size(0) == 0:
        raise InvalidInputError(
            f"{what} patches must have shape (N>0, {shape[0]}, {shape[1]}), got {tuple(patches.shape)}"
        )
    return patches.to(torch.float32).cpu()


def prompt_from_arrays(text: str, audio: np.ndarray | None, reference: np.ndarray | None) -> VoicePrompt:
    """A ``VoicePrompt`` from float32 arrays of (N, P, D) patches (how one is unpickled)."""
    return VoicePrompt(text, _tensor(audio), _tensor(reference))


def _array(patches: torch.Tensor | None) -> np.ndarray | None:
    return None if patches is None else patches.detach().to(device="cpu", dtype=torch.float32).numpy()


def _tensor(array: np.ndarray | None) -> torch.Tensor | None:
    if array is None:
        return None
    if not isinstance(array, np.ndarray) or array.dtype != np.float32 or array.ndim != 3:
        raise InvalidInputError("a voice prompt's patches are float32 arrays of (N, P, D)")
    return torch.from_numpy(array.copy())
