"""Paged KV cache for one transformer stack (base LM or residual LM): a pool of fixed-size blocks.

Per layer, keys and values are each one tensor ``(num_blocks, block_size, kv_heads, head_dim)`` (the
layout the paged-decode kernel reads). A row (one session) owns a list of blocks, its *block table*:
position p of the row lives in block ``table[p // block_size]`` at offset ``p % block_size``. Memory
then scales with the positions sessions use, not with sessions x max_length.

Block 0 is the *null block*: never given to a session. Table entries past a row's blocks are 0, so
writes of padding rows and padding positions land there, and it is never read as live data (decode
attention reads only positions below a row's length).

``KVCache.view(tables)`` gives the stack's per-layer views for a batch of rows; ``KVCache.dedicated``
builds a small cache whose rows own consecutive blocks (the one-utterance API and tests).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from voxwire.model_config import MiniCPM4Config

NULL_BLOCK = 0
"""Block id that belongs to no session (padding writes land here)."""


@dataclass(frozen=True)
class LayerKV:
    """One layer's key and value pools, each (num_blocks, block_size, kv_heads, head_dim)."""

    keys: torch.Tensor
    values: torch.Tensor


@dataclass(frozen=True)
class PagedKV:
    """A stack's cache as a batch of rows sees it: every layer's pools and the rows' block tables."""

    layers: list[LayerKV]
    block_tables: torch.Tensor  # (B, W) int32: row b's position p lives in block block_tables[b, p // block_size]

    @property
    def block_size(self) -> int:
        return self.layers[0].keys.size(1)

    def slots(self, positions: torch.Tensor) -> torch.Tensor:
        """positions (B, T) long -> flat indices (B, T) into a layer pool viewed as (blocks*block_size, ...)."""
        size = self.block_size
        blocks = torch.gather(self.block_tables, 1, torch.div(positions, size, rounding_mode="floor"))
        return blocks.long() * size + positions % size

    def write(self, layer: int, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store one token per row: k, v (B, nkv, hd) at per-row positions (B,)."""
        self.write_slots(layer, self.slots(positions[:, None])[:, 0], k, v)

    def write_slots(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k, v (N, nkv, hd) at flat slots (N,) (from ``slots``)."""
        pools = self.layers[layer]
        pools.keys.view(-1, *pools.keys.shape[2:])[slots] = k
        pools.values.view(-1, *pools.values.shape[2:])[slots] = v

    def fill(self, kvs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Store a prefill's per-layer k, v (B, nkv, T, hd) at positions 0..T-1 of every row.

        Positions past a row's own length are padding; they land in the row's own blocks past its length
        (overwritten before they are read) or, past its blocks, in the null block."""
        batch, _, length, _ = kvs[0][0].shape
        positions = torch.arange(length, device=self.block_tables.device).expand(batch, length)
        slots = self.slots(positions).reshape(-1)
        for layer, (k, v) in enumerate(kvs):
            self.write_slots(layer, slots, _token_major(k), _token_major(v))


def _token_major(x: torch.Tensor) -> torch.Tensor:
    """(B, nkv, T, hd) -> (B*T, nkv, hd)."""
    return x.transpose(1, 2).reshape(-1, x.size(1), x.size(3))


class KVCache:
    """The block pool of one stack: ``tensor`` is (2, layers, num_blocks, block_size, kv_heads, head_dim)."""

    def __init__(
        self, config: MiniCPM4Config, num_blocks: int, block_size: int, device: torch.device, dtype: torch.dtype
    ) -> None:
        if num_blocks < 2 or block_size < 1:
            raise ValueError(
                f"a KV pool needs >= 2 blocks (one is the null block) of >= 1 position, got {num_blocks} x {block_size}"
            )
        self.num_layers = config.num_hidden_layers
        self.block_size = block_size
        shape = (2, config.num_hidden_layers, num_blocks, block_size, config.num_key_value_heads, config.head_dim)
        self.tensor = torch.zeros(shape, device=device, dtype=dtype)
        self.layers = [LayerKV(self.tensor[0, i], self.tensor[1, i]) for i in range(self.num_layers)]

    @property
    def num_blocks(self) -> int:
        return self.tensor.size(2)

    @staticmethod
    def bytes_per_position(config: MiniCPM4Config, dtype: torch.dtype) -> int:
        element = torch.empty((), dtype=dtype).element_size()
        return 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * element

    def view(self, block_tables: torch.Tensor) -> PagedKV:
        return PagedKV(self.layers, block_tables)

    @classmethod
    def dedicated(
        cls,
        config: MiniCPM4Config,
        rows: int,
        length: int,
        device: torch.device,
        dtype: torch.dtype,
        block_size: int = 16,
    ) -> PagedKV:
        """A cache of ``rows`` rows of ``length`` positions each, every row owning consecutive blocks."""
        per_row = math.ceil(length / block_size)
        cache = cls(config, 1 + rows * per_row, block_size, device, dtype)
        tables = torch.arange(1, 1 + rows * per_row, device=device, dtype=torch.int32).view(rows, per_row)
        return cache.view(tables)
