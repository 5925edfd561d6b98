"""Finite scalar quantisation bottleneck on the base LM's hidden state at audio positions."""

from __future__ import annotations

import torch
from torch import nn


class ScalarQuantizationLayer(nn.Module):
    def __init__(self, hidden_size: int, latent_dim: int, scale: int) -> None:
        super().__init__()
        self.scale = scale
        self.in_proj = nn.Linear(hidden_size, latent_dim)
        self.out_proj = nn.Linear(latent_dim, hidden_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden (..., H) -> (..., H), rounded to 2*scale+1 levels per latent dimension."""
        latent = torch.tanh(self.in_proj(hidden))
        return self.out_proj(torch.round(latent * self.scale) / self.scale)
