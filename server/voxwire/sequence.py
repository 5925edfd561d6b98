"""Input sequences: ``lay_out`` lays a target text and a voice (``VoicePrompt``) out as the model's input
positions exactly as the reference does (spec section 4.3), as token ids (``PromptLayout``, what a runner keeps
from a request's arrival to its prefill); ``PromptLayout.tensors`` makes them the model's input
(``InputSequence``; both at once: ``build_sequence``). The length caps follow from the layout:

==========================  ==============================================================
mode                        positions
==========================  ==============================================================
zero-shot                   tok(text) 101
continuation                tok(prompt_text + text) 101 A[0..Np-1]
reference (v2)              103 R[0..Nr-1] 104 tok(text) 101
reference + continuation    103 R[0..Nr-1] 104 tok(prompt_text + text) 101 A[0..Np-1]
==========================  ==============================================================

This is where a voice's patches become tensors: the model's side only (the runner, ``tts``), never a frontend.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from voxwire.errors import InvalidInputError
from voxwire.model_config import ModelConfig
from voxwire.prompt import Patches, VoicePrompt
from voxwire.text.tokenizer import (
    AUDIO_START_ID,
    REF_AUDIO_END_ID,
    REF_AUDIO_START_ID,
    TextTokenizer,
    normalize_whitespace,
)


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


def sequence_length_cap(sequence: InputSequence | PromptLayout, max_len: int, max_length: int) -> int:
    """Patches a request may generate when its prompt (laid out or built) and patches share ``max_length``
    positions."""
    room = max_length - sequence.length
    if room < 1:
        raise InvalidInputError(
            f"the input takes {sequence.length} positions but the model holds {max_length}: "
            "shorten the text or the voice prompt"
        )
    # The reference would fail with "KV cache is full" past max_length; stop at the cache's end instead.
    return min(length_cap(sequence.target_tokens, max_len), room)


@dataclass(frozen=True)
class PromptLayout:
    """A request's input positions as token ids and the voice that fills its audio positions, before any tensor:
    what ``lay_out`` makes of a text once (its one tokenization), and ``tensors`` turns into the model's
    ``InputSequence`` when the request is prefilled. It holds the voice's arrays, not copies of them."""

    text_ids: tuple[int, ...]
    """The text positions after the reference clip (if any): ``tok(prompt_text + text) 101``."""
    target_tokens: int
    """Token count of the target text alone (drives the length cap)."""
    voice: VoicePrompt | None

    @property
    def length(self) -> int:
        """Positions of the whole input: the reference clip's (with its start and end), the text's, the prompt
        audio's."""
        voice = self.voice
        reference = 0 if voice is None or voice.reference_patches is None else voice.reference_patches.shape[0] + 2
        audio = 0 if voice is None or voice.audio_patches is None else voice.audio_patches.shape[0]
        return reference + len(self.text_ids) + audio

    def tensors(self, config: ModelConfig) -> InputSequence:
        """The layout as the model's input (the voice's patches copied into tensors)."""
        shape = (config.patch_size, config.feat_dim)
        parts: list[tuple[list[int], torch.Tensor, float]] = []  # (tokens, feats, is_text) segments
        voice = self.voice
        if voice is not None and voice.reference_patches is not None:
            ref = _patch_tensor(voice.reference_patches)
            parts += [
                ([REF_AUDIO_START_ID], _zeros(1, shape), 1.0),
                ([0] * ref.size(0), ref, 0.0),
                ([REF_AUDIO_END_ID], _zeros(1, shape), 1.0),
            ]
        parts.append((list(self.text_ids), _zeros(len(self.text_ids), shape), 1.0))
        if voice is not None and voice.audio_patches is not None:
            audio = _patch_tensor(voice.audio_patches)
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
            target_tokens=self.target_tokens,
            decode_context=_decode_context(config, feats, audio_mask),
        )


def lay_out(tokenizer: TextTokenizer, config: ModelConfig, text: str, prompt: VoicePrompt | None) -> PromptLayout:
    """Lay ``text`` and ``prompt`` out as the reference does, tokenizing the text once: the target alone gives the
    length cap, and is the text positions too unless a transcript comes before it (then the two are tokenized
    together, as the reference does, which may merge tokens across their boundary: a second tokenization).

    Raises:
        InvalidInputError: the text is empty or has no tokens, or the voice's patches or kind do not fit the model.
    """
    if not isinstance(text, str) or not text.strip():
        raise InvalidInputError("text must be a non-empty string")
    if prompt is not None and prompt.reference_patches is not None and not config.reference_cloning:
        raise InvalidInputError("reference audio (isolated voice cloning) needs a voxcpm2 model")
    shape = (config.patch_size, config.feat_dim)
    if prompt is not None:
        for patches, what in ((prompt.reference_patches, "reference"), (prompt.audio_patches, "prompt audio")):
            if patches is not None:
                _check_patches(patches, shape, what)
    target = normalize_whitespace(text)
    target_ids = tokenizer.encode(target)
    if not target_ids:
        raise InvalidInputError("text has no speakable tokens")
    prompt_text = prompt.text if prompt is not None else ""
    text_ids = tokenizer.encode(prompt_text + target) if prompt_text else target_ids
    return PromptLayout((*text_ids, AUDIO_START_ID), len(target_ids), prompt)


def build_sequence(
    tokenizer: TextTokenizer, config: ModelConfig, text: str, prompt: VoicePrompt | None
) -> InputSequence:
    """``text`` in the voice ``prompt`` as the model's input (``lay_out``, then ``PromptLayout.tensors``)."""
    return lay_out(tokenizer, config, text, prompt).tensors(config)


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


def _check_patches(patches: Patches, shape: tuple[int, int], what: str) -> None:
    if patches.ndim != 3 or tuple(patches.shape[1:]) != shape or patches.shape[0] == 0:
        raise InvalidInputError(
            f"{what} patches must have shape (N>0, {shape[0]}, {shape[1]}), got {tuple(patches.shape)}"
        )


def _patch_tensor(patches: Patches) -> torch.Tensor:
    # A copy: the prompt's arrays may be read-only (unpickled, loaded from a file), and the prompt outlives this.
    return torch.from_numpy(np.array(patches, dtype=np.float32))
