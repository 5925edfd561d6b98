"""Preallocated KV cache pool for one transformer stack: one row ("slot") per live session.

The pool is a single tensor ``(2, layers, slots, kv_heads, max_length, head_dim)``, like the
reference's static cache but with many rows. ``rows(start, count)`` gives views of a contiguous
range of slots, so a batched step over slots ``0..B-1`` reads the pool in place (no gather, static
shapes: what a CUDA graph needs). Each row keeps its own length implicitly: a step at position p
writes p and attends to ``0..p`` of its own row only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from voxstream.config import MiniCPM4Config


@dataclass(frozen=True)
class LayerCache:
    """Keys and values of one layer for a batch of rows: each (B, nkv, max_length, hd)."""

    keys: torch.Tensor
    values: torch.Tensor

    def write(self, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k, v (B, nkv, hd) at per-row positions (B,)."""
        rows = torch.arange(positions.size(0), device=positions.device)
        self.keys[rows, :, positions] = k
        self.values[rows, :, positions] = v

    def mask(self, positions: torch.Tensor) -> torch.Tensor:
        """Attention mask (B, 1, 1, max_length): row b sees its own positions 0..positions[b]."""
        span = torch.arange(self.keys.size(2), device=positions.device)
        return (span[None, :] <= positions[:, None])[:, None, None, :]

    def fill(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store a prefill's k, v (B, nkv, T, hd) at positions 0..T-1."""
        length = k.size(2)
        self.keys[:, :, :length] = k
        self.values[:, :, :length] = v


class KVCache:
    """The cache pool of one stack (base LM or residual LM)."""

    def __init__(
        self, config: MiniCPM4Config, num_slots: int, max_length: int, device: torch.device, dtype: torch.dtype
    ) -> None:
        self.num_layers = config.num_hidden_layers
        self.max_length = max_length
        shape = (2, config.num_hidden_layers, num_slots, config.num_key_value_heads, max_length, config.head_dim)
        self.tensor = torch.zeros(shape, device=device, dtype=dtype)

    @property
    def num_slots(self) -> int:
        return self.tensor.size(2)

    @staticmethod
    def bytes_per_slot(config: MiniCPM4Config, max_length: int, dtype: torch.dtype) -> int:
        element = torch.empty((), dtype=dtype).element_size()
        return 2 * config.num_hidden_layers * config.num_key_value_heads * max_length * config.head_dim * element

    def rows(self, start: int, count: int) -> list[LayerCache]:
        """Per-layer views of slots ``start .. start+count-1``."""
        window = self.tensor[:, :, start : start + count]
        return [LayerCache(window[0, layer], window[1, layer]) for layer in range(self.num_layers)]

    def move_rows(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy whole slots src -> dst (both (N,) long): the engine compacts its pool this way."""
        self.tensor[:, :, dst] = self.tensor[:, :, src]
