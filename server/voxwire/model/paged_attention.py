"""Decode attention over a paged KV cache: one query token per row, reading only that row's live positions.

Three implementations share one signature, ``(q (B, Hq, D), k_cache and v_cache (num_blocks, block_size,
Hkv, D), block_tables (B, W) int32, seq_lens (B,) int32, scale) -> (B, Hq, D)``:

* ``paged_decode_torch``: plain torch, any device. It gathers the blocks named by ``block_tables``, zeroes keys
  and values past each row's length (a stale value is never multiplied by a zero weight: 0 x NaN = NaN), and
  runs SDPA with the GQA group folded into the query axis, so it needs a mask but never ``enable_gqa`` (on CUDA
  a mask with ``enable_gqa`` forces the slow MATH backend). SDPA sums a row's positions in an order that
  depends on how many positions the call spans (its kernel's blocking, its GEMMs' kernels, which also depend on
  the instruction set), so rows are attended in groups over a width of their own: their blocks rounded up to
  a power of two, whatever the table's width or the other rows. A row's call then has the same shapes alone
  or in any batch (only the number of rows differs, and SDPA computes each row and head on its own), so its
  result is the same bits. That grouping reads the lengths on the host, so only the CPU does it; on a GPU
  one call spans the whole table. It is the CPU path and the oracle of the kernel.
* the Triton kernel ``voxwire.kernels.paged_decode.paged_decode_attention`` on CUDA, when ``kernels.path``
  chose Triton for the device (the fused ops follow the same choice).
* ``paged_decode_chunked``: plain torch, for batch-invariant numerics (``kernels.batch_invariant``), also inside
  CUDA graphs (no host reads, so one width for the whole batch). It walks the positions in chunks of
  ``CHUNK_POSITIONS`` aligned to position 0, with an online softmax and no matmul, so a row's result depends
  only on its own blocks and length (a chunk past its length changes nothing, exactly).

``decode_attention`` picks one; ``attention_path`` names the one a device gets (for reports).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from voxwire.kernels import batch_invariant
from voxwire.kernels.path import uses_triton

PagedDecode = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor]


def paged_decode_torch(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    if q.device.type != "cpu":
        # On a GPU the lengths stay on the device: a graph takes no host reads, and outside one a read would
        # sync every step. One width for every row (the whole table); the GPU's batch-invariant mode is the
        # chunked path below, and its default path is not bitwise batch-invariant anyway (GEMM kernels per M).
        return _attend(q, k_cache, v_cache, block_tables, seq_lens, scale)
    groups: dict[int, list[int]] = {}  # width in blocks -> the rows attended over that many
    for row, length in enumerate(seq_lens.tolist()):
        groups.setdefault(_width(length, k_cache.size(1)), []).append(row)
    if len(groups) == 1:
        (width,) = groups
        return _attend(q, k_cache, v_cache, _fit(block_tables, width), seq_lens, scale)
    out = torch.empty_like(q)
    for width, members in groups.items():
        rows = torch.tensor(members, device=q.device)
        tables = _fit(block_tables.index_select(0, rows), width)
        out[rows] = _attend(q[rows], k_cache, v_cache, tables, seq_lens[rows], scale)
    return out


def _width(length: int, block_size: int) -> int:
    """Blocks a row of ``length`` positions is attended over: its own, rounded up to a power of two (at least one),
    so that it depends on the row alone and a batch has few distinct widths."""
    return 1 << (max(1, -(-length // block_size)) - 1).bit_length()


def _fit(block_tables: torch.Tensor, width: int) -> torch.Tensor:
    """block_tables (B, W) cut or padded (with block 0, past every row's length) to (B, width)."""
    if block_tables.size(1) >= width:
        return block_tables[:, :width]
    return F.pad(block_tables, (0, width - block_tables.size(1)))


def _attend(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """SDPA of every row over all of ``block_tables``' positions, those past its length zeroed and masked."""
    batch, q_heads, dim = q.shape
    _, block_size, kv_heads, _ = k_cache.shape
    width = block_tables.size(1) * block_size
    blocks = block_tables.long()
    # (B, W*bs, Hkv, D) -> (B, Hkv, W*bs, D)
    keys = k_cache[blocks].view(batch, width, kv_heads, dim).transpose(1, 2)
    values = v_cache[blocks].view(batch, width, kv_heads, dim).transpose(1, 2)
    live = torch.arange(width, device=q.device)[None, :] < seq_lens[:, None]  # (B, W*bs)
    dead = ~live[:, None, :, None]
    keys, values = keys.masked_fill(dead, 0.0), values.masked_fill(dead, 0.0)
    # The query heads sharing a KV head become that head's "query positions": GQA without repeating K/V.
    grouped = q.view(batch, kv_heads, q_heads // kv_heads, dim)
    out = F.scaled_dot_product_attention(grouped, keys, values, attn_mask=live[:, None, None, :], scale=scale)
    return out.reshape(batch, q_heads, dim)


CHUNK_POSITIONS = 64
"""Positions per step of ``paged_decode_chunked`` (rounded up to whole blocks)."""


def paged_decode_chunked(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    batch, q_heads, dim = q.shape
    _, block_size, kv_heads, _ = k_cache.shape
    per_chunk = -(-CHUNK_POSITIONS // block_size)
    width = block_tables.size(1)
    tables = block_tables.long()
    if width % per_chunk:  # every chunk has the same shape; the extra blocks are past every row's length
        tables = F.pad(tables, (0, per_chunk - width % per_chunk))
    # Products and sums rather than matmuls: a batched matmul's kernel may depend on the batch.
    grouped = q.view(batch, kv_heads, q_heads // kv_heads, 1, dim).float()
    best = q.new_full((batch, kv_heads, q_heads // kv_heads), float("-inf"), dtype=torch.float32)
    total = torch.zeros_like(best)
    acc = torch.zeros(batch, kv_heads, q_heads // kv_heads, dim, device=q.device)
    offsets = torch.arange(per_chunk * block_size, device=q.device)
    for first in range(0, tables.size(1), per_chunk):
        blocks = tables[:, first : first + per_chunk]
        # (B, C, Hkv, D) -> (B, Hkv, 1, C, D)
        keys = k_cache[blocks].view(batch, -1, kv_heads, dim).transpose(1, 2).unsqueeze(2).float()
        values = v_cache[blocks].view(batch, -1, kv_heads, dim).transpose(1, 2).unsqueeze(2).float()
        live = (first * block_size + offsets)[None, :] < seq_lens[:, None]  # (B, C)
        dead = ~live[:, None, None, :]
        # Zeroed, not only masked: a stale value is never multiplied by a zero weight (0 x NaN = NaN).
        keys, values = keys.masked_fill(dead[..., None], 0.0), values.masked_fill(dead[..., None], 0.0)
        scores = ((grouped * keys).sum(-1) * scale).masked_fill(dead, float("-inf"))  # (B, Hkv, G, C)
        new_best = torch.maximum(best, scores.amax(-1))
        # Until a row has seen a live position its maximum is -inf, and -inf - -inf would be NaN.
        shift = new_best.masked_fill(new_best == float("-inf"), 0.0)
        weights = torch.exp(scores - shift[..., None])
        rescale = torch.exp(best - shift)
        total = total * rescale + weights.sum(-1)
        acc = acc * rescale[..., None] + (weights[..., None] * values).sum(-2)
        best = new_best
    # A row with seq_len 0 saw no position: zeros, as from the other paths.
    out = acc / torch.where(total > 0, total, 1.0)[..., None]
    return out.reshape(batch, q_heads, dim).to(q.dtype)


def _triton_kernel() -> PagedDecode:
    from voxwire.kernels.paged_decode import paged_decode_attention

    return paged_decode_attention


def attention_path(device: torch.device) -> str:
    """Which implementation decode attention uses on ``device`` (the fused ops' choice: ``kernels.path``)."""
    return "triton-paged" if uses_triton(device) else "torch-paged"


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    if batch_invariant.active():
        return paged_decode_chunked(q, k_cache, v_cache, block_tables, seq_lens, scale)
    kernel = _triton_kernel() if uses_triton(q.device) else paged_decode_torch
    return kernel(q, k_cache, v_cache, block_tables, seq_lens, scale)
