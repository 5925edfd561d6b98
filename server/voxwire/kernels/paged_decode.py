"""Paged decode attention as a Triton kernel (CUDA; tested on CPU under ``TRITON_INTERPRET=1``).

One program per (row, kv head): it loads the query heads of that kv head's GQA group once, walks the
row's blocks ``0 .. ceil(seq_len / block_size) - 1`` through its block table in one pass with an online
softmax, and never reads a position at or past ``seq_len`` (so blocks that belong to other rows or hold
stale values, NaN included, cannot leak in). Everything is computed in fp32 whatever the cache dtype.
The two products run as TF32 tensor-core dots for bf16/fp16 caches, which is exact for ``q·k`` (bf16 and
fp16 values are TF32 values) and rounds the softmax weights to TF32 (finer than the bf16 that flash
kernels use); fp32 caches get exact fp32 dots. (Keeping the operands fp32 also sidesteps the Triton
interpreter, which mis-multiplies bf16 ``tl.dot`` operands, so the interpreter tests cover the real code.)

Import this module only where Triton is meant to run (CUDA, or the interpreter tests): ``triton.jit``
decides between compiled and interpreted execution when the module is imported.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# tl.dot needs every operand dimension to be at least 16: the query group is padded up to this.
_MIN_DOT = 16
# Positions per loop iteration: one block of 16 or 32, or 32 positions of a larger block (bounds registers).
_MAX_TILE = 32


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


@triton.jit
def _paged_decode_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    tables_ptr,
    lens_ptr,
    out_ptr,
    scale,
    block_size,
    stride_qb,
    stride_qh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_tb,
    stride_ob,
    stride_oh,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    TILE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PRECISION: tl.constexpr,
):
    row = tl.program_id(0)
    kv_head = tl.program_id(1)
    length = tl.load(lens_ptr + row)
    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, HEAD_DIM)
    s = tl.arange(0, TILE)
    heads = kv_head * GROUP + g
    in_group = g < GROUP
    q = tl.load(q_ptr + row * stride_qb + heads[:, None] * stride_qh + d[None, :], mask=in_group[:, None], other=0.0)
    q = q.to(tl.float32)

    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    for start in range(0, length, TILE):
        # A tile of TILE positions; each looks its block up in the table (one block per tile when
        # block_size == TILE, several when blocks are smaller). Masked lanes read neither table nor cache.
        positions = start + s
        live = positions < length
        block = tl.load(tables_ptr + row * stride_tb + positions // block_size, mask=live, other=0).to(tl.int64)
        offset = positions % block_size
        k = tl.load(
            k_ptr + block[:, None] * stride_kb + offset[:, None] * stride_ks + kv_head * stride_kh + d[None, :],
            mask=live[:, None],
            other=0.0,
        ).to(tl.float32)
        v = tl.load(
            v_ptr + block[:, None] * stride_vb + offset[:, None] * stride_vs + kv_head * stride_vh + d[None, :],
            mask=live[:, None],
            other=0.0,
        ).to(tl.float32)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
        scores = tl.where(live[None, :], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=PRECISION)
        m_i = m_new

    # A row with seq_len 0 never entered the loop: acc is 0 and so is its output.
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(
        out_ptr + row * stride_ob + heads[:, None] * stride_oh + d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=in_group[:, None],
    )


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Same contract as ``voxwire.model.paged_attention.paged_decode_torch`` (the CPU path, and this
    kernel's test oracle): q (B, Hq, D), caches (num_blocks, block_size, Hkv, D), block_tables
    (B, max_blocks) int32, seq_lens (B,) int32 -> (B, Hq, D); query head h reads kv head h // (Hq // Hkv);
    a row with seq_len 0 gets zeros.

    Any block size; the head dim must be a power of two of at least 16 (every VoxCPM stack's is).
    Launch shapes depend on B, Hkv and the dtypes only, so the call can be captured in a CUDA graph.
    """
    check_paged_shapes(q, k_cache, v_cache, block_tables, seq_lens)
    batch, q_heads, head_dim = q.shape
    block_size, kv_heads = k_cache.size(1), k_cache.size(2)
    if head_dim < _MIN_DOT or head_dim & (head_dim - 1):
        raise ValueError(f"head_dim must be a power of two >= {_MIN_DOT}, got {head_dim}")
    if q.stride(-1) != 1 or k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1 or block_tables.stride(-1) != 1:
        raise ValueError("q, the caches and block_tables must be contiguous in their last dimension")
    group = q_heads // kv_heads
    out = torch.empty_like(q)
    precision = "ieee" if k_cache.dtype == torch.float32 else "tf32"
    _paged_decode_kernel[(batch, kv_heads)](
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        out,
        scale,
        block_size,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        GROUP=group,
        GROUP_PAD=max(_MIN_DOT, triton.next_power_of_2(group)),
        TILE=min(_MAX_TILE, max(_MIN_DOT, triton.next_power_of_2(block_size))),
        HEAD_DIM=head_dim,
        PRECISION=precision,
    )
    return out
