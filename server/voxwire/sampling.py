"""The seed contract: a request's CFM noise is a private random stream, independent of other requests.

With seed S, the noise of step i is the i-th ``torch.randn((1, feat_dim, patch_size), dtype=<model
dtype>)`` drawn from a ``torch.Generator`` on the model's device seeded with S. That is the stream the
reference draws after ``torch.manual_seed(S)`` (nothing else consumes it during generation), so the
same seed gives the reference's audio, and batching never changes a request's noise.
"""

from __future__ import annotations

import math
import secrets

import torch

from voxwire.kernels.path import NoisePath, noise_path


def random_seed() -> int:
    """A fresh 32-bit seed for requests that did not ask for one."""
    return secrets.randbits(32)


class NoiseStream:
    """One request's noise: ``next()`` returns the next (1, D, P) draw."""

    def __init__(self, seed: int, feat_dim: int, patch_size: int, dtype: torch.dtype, device: torch.device) -> None:
        self.seed = seed
        self.shape = (1, feat_dim, patch_size)
        self.dtype = dtype
        self.device = device
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)

    def next(self) -> torch.Tensor:
        return torch.randn(self.shape, dtype=self.dtype, device=self.device, generator=self.generator)

    def take(self, count: int) -> torch.Tensor:
        """The next ``count`` draws as one (count, D, P) tensor, equal to ``count`` calls of ``next``."""
        if self.device.type == "cpu" and math.prod(self.shape) % 16 == 0:
            # The CPU generator fills normals 16 at a time from one uniform stream, so a single draw of
            # whole patches consumes the stream exactly as patch-by-patch draws do (one call, not count).
            shape = (count, *self.shape[1:])
            return torch.randn(shape, dtype=self.dtype, device=self.device, generator=self.generator)
        if noise_path(self.device) is NoisePath.ONE_LAUNCH:
            # CUDA: a bigger randn maps its threads to other numbers, so one kernel computes the count small
            # calls' numbers (checked against eager calls at start-up), and the generator moves on as they would.
            from voxwire.kernels.noise import CALL_OFFSET, patch_noise

            offset = self.generator.get_offset()
            drawn = patch_noise(self.seed, offset // CALL_OFFSET, count, self.shape[1:], self.dtype, self.device)
            self.generator.set_offset(offset + CALL_OFFSET * count)
            return drawn
        return torch.cat([self.next() for _ in range(count)])
