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

``small_rope_attention`` takes q and k before RoPE (the q/k/v GEMM's output) and rotates them as it loads them, with
``fused._rope_kernel``'s arithmetic and rounding, so the rotated q is never written and read back; it writes the
rotated k, which the caller returns as the layer's keys.

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
    cos_ptr,
    sin_ptr,
    k_out_ptr,
    stride_ct,
    stride_st,
    GROUP: tl.constexpr,
    ROWS: tl.constexpr,
    KEYS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PRECISION: tl.constexpr,
    ROPE: tl.constexpr,
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
    q_at = q_ptr + row * stride_qb + heads[:, None] * stride_qh + tokens[:, None] * stride_qt
    k_at = k_ptr + row * stride_kb + kv_head * stride_kh + s[:, None] * stride_kt
    q = tl.load(q_at + d[None, :], mask=live_query, other=0.0)
    k = tl.load(k_at + d[None, :], mask=live_key[:, None], other=0.0)
    if ROPE:
        q = _rotated(q, q_at, tokens, live_query, cos_ptr, sin_ptr, stride_ct, stride_st, HEAD_DIM)
        k = _rotated(k, k_at, s, live_key[:, None], cos_ptr, sin_ptr, stride_ct, stride_st, HEAD_DIM)
        k_out = k_out_ptr + ((row * tl.num_programs(1) + kv_head) * length + s[:, None]) * HEAD_DIM + d[None, :]
        tl.store(k_out, k, mask=live_key[:, None])
    q = q.to(tl.float32)
    k = k.to(tl.float32)
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


@triton.jit
def _rotated(x, x_at, tokens, live, cos_ptr, sin_ptr, stride_ct, stride_st, HEAD_DIM: tl.constexpr):
    """RoPE of a loaded [rows, HEAD_DIM] tile x (rows at ``x_at``, token ``tokens`` each) in fp32, rounded to x's
    dtype: x * cos + rotate_half(x) * sin, rotate_half(x) = (-x2, x1), as ``fused._rope_kernel`` computes it."""
    HALF: tl.constexpr = HEAD_DIM // 2
    d = tl.arange(0, HEAD_DIM)
    partner = tl.load(x_at + ((d + HALF) % HEAD_DIM)[None, :], mask=live, other=0.0).to(tl.float32)
    rotated = tl.where((d < HALF)[None, :], -partner, partner)
    c = tl.load(cos_ptr + tokens[:, None] * stride_ct + d[None, :], mask=live, other=0.0).to(tl.float32)
    s = tl.load(sin_ptr + tokens[:, None] * stride_st + d[None, :], mask=live, other=0.0).to(tl.float32)
    return (x.to(tl.float32) * c + rotated * s).to(x.dtype)


def small_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Non-causal GQA attention: q (B, Hq, T, hd), k and v (B, Hkv, T, hd), any strides with a unit stride along hd
    -> (B, T, Hq, hd) contiguous (its transpose(1, 2) is SDPA's output: the output projection's input without a
    copy). Query head h reads kv head h // (Hq // Hkv). The shape must fit one tile (``grids.small_attention_tile``)."""
    out, _ = _launch(q, k, v, scale, None)
    return out


def small_rope_attention(
    q_and_k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, q_heads: int, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``small_attention`` of RoPE-rotated q and k (``reference.rope_qk`` with cos, sin (T, hd)), from q_and_k (B,
    Hq + Hkv, T, hd) before RoPE (any strides with a unit stride along hd) -> (the output (B, T, Hq, hd), the rotated
    k (B, Hkv, T, hd) contiguous)."""
    _, heads, length, head_dim = q_and_k.shape
    if cos.shape != (length, head_dim) or sin.shape != cos.shape or cos.stride(-1) != 1 or sin.stride(-1) != 1:
        raise ValueError(f"cos {tuple(cos.shape)} and sin {tuple(sin.shape)} must be ({length}, {head_dim}) rows")
    q, k = q_and_k.split([q_heads, heads - q_heads], dim=1)
    out, rotated = _launch(q, k, v, scale, (cos, sin))
    assert rotated is not None
    return out, rotated


def _launch(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, rope: tuple[torch.Tensor, torch.Tensor] | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
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
    rotated = k.new_empty(batch, kv_heads, length, head_dim) if rope is not None else None
    cos, sin = rope if rope is not None else (q, q)  # unread without RoPE
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
        cos,
        sin,
        out if rotated is None else rotated,
        cos.stride(0),
        sin.stride(0),
        GROUP=group,
        ROWS=rows,
        KEYS=keys,
        HEAD_DIM=head_dim,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        ROPE=rope is not None,
        num_warps=grids.small_attention_warps(rows, head_dim, q.element_size(), rope is not None),
    )
    return out, rotated
