"""LocDiT: the diffusion transformer that predicts one latent patch's velocity.

The sequence it runs on is ``[prefix tokens, cond patch tokens (P), noisy patch tokens (P)]``:

* ``voxcpm`` (v1): one prefix token, ``mu + time embedding``;
* ``voxcpm2``: ``mu`` carries two tokens (base-LM and residual-LM projections) and the time
  embedding is a third token of its own.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from voxwire.model.minicpm import MiniCPMModel, linear_rows
from voxwire.model_config import MiniCPM4Config


def sinusoidal_embedding(t: torch.Tensor, dim: int, scale: float = 1000.0) -> torch.Tensor:
    """t (N,) -> (N, dim). Computed in t's dtype, as the reference does (bf16 at bf16 inference)."""
    half = dim // 2
    exponent = math.log(10000) / (half - 1)
    freqs = torch.exp(torch.arange(half, dtype=t.dtype, device=t.device) * -exponent)
    angles = scale * t.unsqueeze(1) * freqs.unsqueeze(0)
    return torch.cat((angles.sin(), angles.cos()), dim=-1)


class TimestepEmbedding(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(dim, dim, bias=True)
        self.linear_2 = nn.Linear(dim, dim, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(F.silu(self.linear_1(x)))


class VoxCPMLocDiT(nn.Module):
    """The velocity estimator. ``mu_tokens`` is 1 for ``voxcpm`` and 2 for ``voxcpm2``."""

    def __init__(self, config: MiniCPM4Config, in_channels: int, patch_size: int, mu_tokens: int) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.hidden_size = hidden
        self.mu_tokens = mu_tokens
        self.in_proj = nn.Linear(in_channels, hidden, bias=True)
        self.cond_proj = nn.Linear(in_channels, hidden, bias=True)
        self.out_proj = nn.Linear(hidden, in_channels, bias=True)
        self.time_mlp = TimestepEmbedding(hidden)
        self.delta_time_mlp = TimestepEmbedding(hidden)
        # Tokens in front of the cond tokens: mu + time as one (voxcpm), or the mu tokens then time (voxcpm2).
        self.prefix_tokens = 1 if mu_tokens == 1 else mu_tokens + 1
        self.decoder = MiniCPMModel(config, rope_positions=self.prefix_tokens + 2 * patch_size)

    def forward(
        self, x: torch.Tensor, mu: torch.Tensor, t: torch.Tensor, cond: torch.Tensor, dt: torch.Tensor
    ) -> torch.Tensor:
        """x (N, D, P) noisy patch, mu (N, mu_tokens*Hd), t and dt (N,), cond (N, D, P) previous patch
        -> velocity (N, D, P)."""
        return self.velocity(x, mu, self.time_embedding(t, dt), self.sequence(mu, self.cond_tokens(cond)))

    def time_embedding(self, t: torch.Tensor, dt: torch.Tensor) -> torch.Tensor:
        """t, dt (N,) -> (N, Hd). Depends on the time grid only, so the sampler computes it once per grid."""
        dtype = self.in_proj.weight.dtype
        time = self.time_mlp(sinusoidal_embedding(t, self.hidden_size).to(dtype))
        return time + self.delta_time_mlp(sinusoidal_embedding(dt, self.hidden_size).to(dtype))

    def cond_tokens(self, cond: torch.Tensor) -> torch.Tensor:
        """cond (N, D, P) -> (N, P, Hd). Constant over a patch's timesteps, so the sampler computes it once."""
        # Contiguous, as the reference feeds it: in bf16 the GEMM path (and its rounding) depends on layout.
        return self.cond_proj(cond.transpose(1, 2).contiguous())

    def sequence(self, mu: torch.Tensor, cond_tokens: torch.Tensor) -> torch.Tensor:
        """mu (N, mu_tokens*Hd), cond_tokens (N, P, Hd) -> the decoder input (N, prefix_tokens + 2P, Hd) with the
        parts that are constant over a patch's timesteps in place (voxcpm2's mu tokens, the cond tokens); the
        time and noisy-patch slots are left for ``velocity`` to fill at each timestep, so a timestep writes
        those alone instead of concatenating the whole sequence again."""
        batch, patch, hidden = cond_tokens.shape
        sequence = cond_tokens.new_empty(batch, self.prefix_tokens + 2 * patch, hidden)
        if self.mu_tokens > 1:
            sequence[:, : self.mu_tokens] = mu.view(batch, self.mu_tokens, hidden)
        sequence[:, self.prefix_tokens : self.prefix_tokens + patch] = cond_tokens
        return sequence

    def velocity(self, x: torch.Tensor, mu: torch.Tensor, time: torch.Tensor, sequence: torch.Tensor) -> torch.Tensor:
        """x (N, D, P), mu (N, mu_tokens*Hd), time (N, Hd) from ``time_embedding``, sequence from ``sequence``
        (its time and patch slots are overwritten) -> velocity (N, D, P)."""
        tokens = self.in_proj(x.transpose(1, 2).contiguous())
        if self.mu_tokens == 1:
            torch.add(mu, time, out=sequence[:, 0])
        else:
            sequence[:, self.mu_tokens] = time
        sequence[:, sequence.size(1) - tokens.size(1) :] = tokens
        hidden, _ = self.decoder(sequence, is_causal=False)
        # The patch tokens are a slice of each row's sequence: one GEMM over all of them (``linear_rows``).
        velocity = linear_rows(self.out_proj, hidden[:, sequence.size(1) - tokens.size(1) :])
        return velocity.transpose(1, 2)
