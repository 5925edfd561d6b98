"""Bidirectional self-attention over a few tokens (LocDiT's 11, LocEnc's 5) in Triton, for GQA.

SDPA's flash and cuDNN kernels tile each (row, head) by 64-128 queries and 64 keys, so an 11-token sequence runs a
whole tile per head: ~98 % of the MMA work is padding. Here one program takes one (batch row, kv head): the
``group`` query heads sharing that kv head are stacked into one tile of ``group * length`` query rows (88 for
VoxCPM2's DiT, padded to 128) against the row's keys (padded to 16), so a row's heads share one load of its keys
and values and the padding is ~4x, not ~70x.

Numerics are those of SDPA over half-precision inputs: the scores' products exact, accumulated in fp32; the softmax
in fp32; its unnormalized weights rounded to the input dtype for the product with the values (fp32 accumulation),
then divided by their fp32 sum and rounded once to the output dtype. fp32 inputs run every product in IEEE fp32.
A program reads its own row only, so a row's output does not depend on the rest of the batch, to the bit.

Import only where Triton is meant to run (CUDA, or the interpreter tests), as ``fused``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from voxwire.kernels import grids


@triton.jit(do_not_specialize=["length"])
def _small_attention_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    out_ptr,
    length,
    scale,
    stride_qb,
    stride_qh,
    stride_qt,
    stride_kb,
    stride_kh,
    stride_kt,
    stride_vb,
    stride_vh,
    stride_vt,
    stride_ob,
    stride_ot,
    stride_oh,
    GROUP: tl.constexpr,
    ROWS: tl.constexpr,
    KEYS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PRECISION: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    # Query row r of the tile is token r % length of the group's query head r // length.
    r = tl.arange(0, ROWS)
    heads = kv_head * GROUP + r // length
    tokens = r % length
    live_query = (r < GROUP * length)[:, None]
    s = tl.arange(0, KEYS)
    live_key = s < length
    d = tl.arange(0, HEAD_DIM)
    # Half-precision operands enter the dots as fp32 at TF32 precision: exact (a bf16 or fp16 value has at most TF32's
    # 10 mantissa bits), so each product is exact and summed in fp32, as a bf16 MMA's would be.
    q = tl.load(
        q_ptr + row * stride_qb + heads[:, None] * stride_qh + tokens[:, None] * stride_qt + d[None, :],
        mask=live_query,
        other=0.0,
    ).to(tl.float32)
    k = tl.load(
        k_ptr + row * stride_kb + kv_head * stride_kh + s[:, None] * stride_kt + d[None, :],
        mask=live_key[:, None],
        other=0.0,
    ).to(tl.float32)
    v = tl.load(
        v_ptr + row * stride_vb + kv_head * stride_vh + s[:, None] * stride_vt + d[None, :],
        mask=live_key[:, None],
        other=0.0,
    )
    scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale  # [ROWS, KEYS]
    scores = tl.where(live_key[None, :], scores, float("-inf"))
    weights = tl.exp(scores - tl.max(scores, 1)[:, None])
    total = tl.sum(weights, 1)
    # The weights rounded to the values' dtype before their product, as SDPA rounds them; divided by the fp32 sum.
    rounded = weights.to(v.dtype).to(tl.float32)
    out = tl.dot(rounded, v.to(tl.float32), input_precision=PRECISION) / total[:, None]
    tl.store(
        out_ptr + row * stride_ob + tokens[:, None] * stride_ot + heads[:, None] * stride_oh + d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=live_query,
    )


def small_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Non-causal GQA attention: q (B, Hq, T, hd), k and v (B, Hkv, T, hd), any strides with a unit stride along hd
    -> (B, T, Hq, hd) contiguous (its transpose(1, 2) is SDPA's output: the output projection's input without a
    copy). Query head h reads kv head h // (Hq // Hkv). The shape must fit one tile (``grids.small_attention_tile``)."""
    batch, q_heads, length, head_dim = q.shape
    kv_heads = k.size(1)
    if k.shape != (batch, kv_heads, length, head_dim) or v.shape != k.shape:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must be (B, Hkv, T, hd) of q {tuple(q.shape)}")
    if kv_heads == 0 or q_heads % kv_heads:
        raise ValueError(f"{q_heads} query heads are not a multiple of {kv_heads} kv heads")
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError("q, k and v must have a unit stride along head_dim")
    group = q_heads // kv_heads
    tile = grids.small_attention_tile(group, length, head_dim)
    if tile is None:
        raise ValueError(f"{group} heads x {length} tokens of head_dim {head_dim} do not fit one tile")
    rows, keys = tile
    out = q.new_empty(batch, length, q_heads, head_dim)
    _small_attention_kernel[grids.small_attention_grid(batch, kv_heads)](
        q,
        k,
        v,
        out,
        length,
        scale,
        q.stride(0),
        q.stride(1),
        q.stride(2),
        k.stride(0),
        k.stride(1),
        k.stride(2),
        v.stride(0),
        v.stride(1),
        v.stride(2),
        out.stride(0),
        out.stride(1),
        out.stride(2),
        GROUP=group,
        ROWS=rows,
        KEYS=keys,
        HEAD_DIM=head_dim,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=grids.small_attention_warps(rows, head_dim, q.element_size()),
    )
    return out
