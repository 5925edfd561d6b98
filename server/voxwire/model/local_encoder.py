"""LocEnc: turns each latent patch into one embedding (the CLS output of a small non-causal MiniCPM)."""

from __future__ import annotations

import torch
from torch import nn

from voxwire.model.minicpm import MiniCPMModel, linear_rows
from voxwire.model_config import MiniCPM4Config


class VoxCPMLocEnc(nn.Module):
    def __init__(self, config: MiniCPM4Config, input_dim: int, patch_size: int) -> None:
        super().__init__()
        self.special_token = nn.Parameter(torch.zeros(1, 1, 1, config.hidden_size))
        self.in_proj = nn.Linear(input_dim, config.hidden_size, bias=True)
        self.encoder = MiniCPMModel(config, rope_positions=patch_size + 1)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        """patches (B, T, P, D) -> embeddings (B, T, He), a view whose rows are one stride apart (see below)."""
        batch, length, patch, _ = patches.shape
        tokens = linear_rows(self.in_proj, patches)  # a decode step's patches arrive transposed: one GEMM all the same
        cls = self.special_token.expand(batch, length, 1, -1)
        tokens = torch.cat([cls, tokens], dim=2).reshape(batch * length, patch + 1, -1)
        hidden, _ = self.encoder(tokens, is_causal=False)
        # The CLS outputs as a (B, T, He) view whose rows are one stride apart even at T = 1, so the projection into
        # the LM (``enc_to_lm_proj``, which a persona may wrap) folds them into one GEMM without a copy; a reshape
        # would give a length-1 T the stride of a token, and a frozen weight a batched GEMM per row.
        return hidden.unflatten(0, (batch, length))[:, :, 0]
