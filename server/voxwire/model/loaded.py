"""``LoadedModel``: a checkpoint ready to run (config, weights, tokenizer, streaming VAE decoder, persona bank).

This is what the engine's runner works with; ``voxwire.tts.VoxCPM`` adds the one-utterance API (voices,
``generate``, ``stream``) on top, so the engine never depends on that API.
"""

from __future__ import annotations

import torch

from voxwire.model.audio_vae import StreamingVAEDecoder
from voxwire.model.personas import PersonaBank
from voxwire.model.voxcpm import VoxCPMModel
from voxwire.model_config import ModelConfig
from voxwire.text.tokenizer import TextTokenizer


class LoadedModel:
    """A model with everything a batch of its requests needs: tokenize, prefill, decode, decode audio."""

    def __init__(self, config: ModelConfig, model: VoxCPMModel, tokenizer: TextTokenizer, name: str) -> None:
        self.config = config
        self.model = model.eval().requires_grad_(False)
        self.tokenizer = tokenizer
        self.name = name
        self.device = next(model.parameters()).device
        self.dtype = model.base_lm.norm.weight.dtype
        self.vae_decoder = StreamingVAEDecoder(model.audio_vae)
        self.personas: PersonaBank | None = None

    def enable_personas(self, max_personas: int = 4, max_rank: int = 64) -> PersonaBank:
        """Make the model able to run LoRA personas, ``max_personas`` resident at once with ranks up to
        ``max_rank``; returns the bank (made once: later calls return it unchanged)."""
        if self.personas is None:
            self.personas = PersonaBank(self.model, max_personas, max_rank)
        return self.personas

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
