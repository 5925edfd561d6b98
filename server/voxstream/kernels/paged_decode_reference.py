"""Paged decode attention in plain torch: the CPU path and the oracle the Triton kernel is tested against.

The KV cache is a pool of fixed-size blocks ``(num_blocks, block_size, Hkv, D)``; row b's logical
position p lives in block ``block_tables[b, p // block_size]`` at offset ``p % block_size``. A decode
step attends one query token per row to that row's positions ``0 .. seq_lens[b] - 1``.
"""

from __future__ import annotations

import torch


def check_paged_shapes(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
) -> None:
    """Raise ValueError unless the arguments form a consistent paged-decode call."""
    if q.ndim != 3 or k_cache.ndim != 4:
        raise ValueError(
            "q must be (B, Hq, D) and k_cache (num_blocks, block_size, Hkv, D), "
            f"got {tuple(q.shape)} and {tuple(k_cache.shape)}"
        )
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache {tuple(v_cache.shape)} differs from k_cache {tuple(k_cache.shape)}")
    batch, q_heads, head_dim = q.shape
    kv_heads = k_cache.size(2)
    if k_cache.size(3) != head_dim:
        raise ValueError(f"head_dim of q ({head_dim}) and of the cache ({k_cache.size(3)}) differ")
    if q_heads % kv_heads:
        raise ValueError(f"{q_heads} query heads are not a multiple of {kv_heads} kv heads")
    if block_tables.ndim != 2 or block_tables.size(0) != batch or seq_lens.shape != (batch,):
        raise ValueError(f"block_tables must be ({batch}, max_blocks) and seq_lens ({batch},)")


def paged_decode_attention_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """q (B, Hq, D), caches (num_blocks, block_size, Hkv, D), block_tables (B, max_blocks) int32,
    seq_lens (B,) int32 -> (B, Hq, D) in q's dtype.

    GQA: query head h reads kv head ``h // (Hq // Hkv)``. Scores and softmax are fp32; only positions
    below a row's seq_len are read (blocks past it may hold anything, NaN included); a row with
    seq_len 0 gets zeros.
    """
    check_paged_shapes(q, k_cache, v_cache, block_tables, seq_lens)
    batch, q_heads, head_dim = q.shape
    block_size, kv_heads = k_cache.size(1), k_cache.size(2)
    group = q_heads // kv_heads
    out = torch.zeros(batch, q_heads, head_dim, dtype=q.dtype, device=q.device)
    # One row at a time: rows have different lengths, and gathering only each row's live blocks is the
    # point (a padded gather would read what the kernel must not).
    for row in range(batch):
        length = int(seq_lens[row])
        if length == 0:
            continue
        blocks = block_tables[row, : (length + block_size - 1) // block_size].long()
        keys = k_cache[blocks].reshape(-1, kv_heads, head_dim)[:length].float()  # (L, Hkv, D)
        values = v_cache[blocks].reshape(-1, kv_heads, head_dim)[:length].float()
        keys = keys.repeat_interleave(group, dim=1).transpose(0, 1)  # (Hq, L, D)
        values = values.repeat_interleave(group, dim=1).transpose(0, 1)
        scores = (keys @ q[row].float().unsqueeze(-1)).squeeze(-1) * scale  # (Hq, L)
        out[row] = (torch.softmax(scores, dim=-1).unsqueeze(1) @ values).squeeze(1).to(q.dtype)
    return out
