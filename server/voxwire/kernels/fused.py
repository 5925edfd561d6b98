"""Fused elementwise and normalisation kernels in Triton: RMSNorm (with an optional residual add), SiLU*mul
and Snake. Each replaces a chain of eager kernels with one launch that reads its inputs once and writes
its outputs once; the math is that of ``voxwire.kernels.reference`` computed in fp32, with the same
intermediate roundings to the activation dtype.

Import only where Triton is meant to run (CUDA, or the interpreter tests): ``triton.jit`` decides
between compiled and interpreted execution at import.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from voxwire.kernels import grids
from voxwire.kernels.reference import FP8_LEAST_AMAX, FP8_MAX, SNAKE_EPS

# Warps of the two memory-bound kernels whose occupancy registers limited (issue 34, D11; registers per thread from
# ptxas for sm_90, tests/kernels/compile_sm90.py). Both run 2048-element tiles (RoPE: [heads, head_dim / 2], 18 -> 32
# x 64 at VoxCPM2's shape; conv-transpose output: grids.TILE), so more warps hold fewer elements per thread: RoPE at
# two warps took 56-144 registers (12 warps/SM resident), at eight 30-48 (40); the conv-transpose output at four
# took 64-156 (12 warps/SM), at sixteen 23-38 (48). A memory-bound kernel hides its loads' latency with resident warps.
_ROPE_WARPS = 8
_CONV_TRANSPOSE_OUT_WARPS = 16


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    residual_ptr,
    weight_ptr,
    out_ptr,
    hidden_ptr,
    n_cols,
    eps,
    stride_x,
    stride_r,
    stride_o,
    stride_h,
    scale_ptr,
    HAS_RESIDUAL: tl.constexpr,
    FP8_OUT: tl.constexpr,
    FP8_MAX: tl.constexpr,
    LEAST: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        residual = tl.load(residual_ptr + row * stride_r + cols, mask=mask, other=0.0)
        x = (residual.to(tl.float32) + x.to(tl.float32)).to(hidden_ptr.dtype.element_ty)
        tl.store(hidden_ptr + row * stride_h + cols, x, mask=mask)
    x32 = x.to(tl.float32)
    variance = tl.sum(x32 * x32, 0) / n_cols
    normed = (x32 * tl.rsqrt(variance + eps)).to(x.dtype).to(tl.float32)
    weight = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if FP8_OUT:  # rounded to the activation dtype as the unfused norm writes it, then quantized for an fp8 GEMM
        value = (normed * weight).to(x.dtype).to(tl.float32)
        _store_e4m3_row(value, out_ptr + row * stride_o + cols, scale_ptr + row, mask, FP8_MAX, LEAST)
    else:
        tl.store(out_ptr + row * stride_o + cols, (normed * weight).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _silu_mul_kernel(gate_ptr, up_ptr, out_ptr, n_cols, stride_g, stride_u, stride_o, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    gate = tl.load(gate_ptr + row * stride_g + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(up_ptr + row * stride_u + cols, mask=mask, other=0.0).to(tl.float32)
    silu = (gate / (1.0 + tl.exp(-gate))).to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, (silu * up).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _store_e4m3_row(x, q_ptrs, scale_ptr, mask, FP8_MAX: tl.constexpr, LEAST: tl.constexpr):
    """One row x (fp32, masked lanes 0) as ``reference.quantize_rows_fp8``: its largest magnitude, then the row
    scaled onto e4m3's range and rounded (RNE), stored at ``q_ptrs``, its scale at ``scale_ptr``."""
    amax = tl.maximum(tl.max(tl.abs(x), 0), LEAST)
    scaled = tl.clamp(x * tl.div_rn(FP8_MAX, amax), -FP8_MAX, FP8_MAX)
    # Rounded to e4m3's grid here, in exact fp32 steps, so the conversion below only re-encodes a value it holds
    # (Triton's interpreter rounds half away and loses the carry into the exponent; sm_90's cvt.rn is exact either
    # way): the grid's step is 2^(e - 3) in the binade 2^e (subnormals: 2^-9), and adding then subtracting 1.5 * 2^23
    # rounds the magnitude's quotient (< 16) to the nearest integer, ties to even; the sign goes back on after, so a
    # value that rounds to zero keeps it (-0, as torch's conversion gives).
    bits = scaled.to(tl.int32, bitcast=True)
    exponent = ((bits >> 23) & 0xFF) - 127
    step = ((tl.maximum(exponent, -6) - 3 + 127) << 23).to(tl.float32, bitcast=True)
    magnitude = ((tl.abs(scaled) / step + 12582912.0) - 12582912.0) * step
    tl.store(q_ptrs, tl.where(bits < 0, -magnitude, magnitude).to(q_ptrs.dtype.element_ty), mask=mask)
    tl.store(scale_ptr, tl.div_rn(amax, FP8_MAX))


@triton.jit
def _quantize_rows_fp8_kernel(
    x_ptr, q_ptr, scale_ptr, n_cols, stride_x, stride_q, FP8_MAX: tl.constexpr, LEAST: tl.constexpr, BLOCK: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    _store_e4m3_row(x, q_ptr + row * stride_q + cols, scale_ptr + row, mask, FP8_MAX, LEAST)


@triton.jit
def _silu_mul_fp8_kernel(
    gate_ptr,
    up_ptr,
    q_ptr,
    scale_ptr,
    n_cols,
    stride_g,
    stride_u,
    stride_q,
    FP8_MAX: tl.constexpr,
    LEAST: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # A whole row per program (its scale needs all of it): ``_silu_mul_kernel``'s value, rounded to the activation
    # dtype as the unfused op writes it, then quantized.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    gate = tl.load(gate_ptr + row * stride_g + cols, mask=mask, other=0.0)
    dtype = gate.dtype
    gate = gate.to(tl.float32)
    up = tl.load(up_ptr + row * stride_u + cols, mask=mask, other=0.0).to(tl.float32)
    silu = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
    product = (silu * up).to(dtype).to(tl.float32)
    _store_e4m3_row(product, q_ptr + row * stride_q + cols, scale_ptr + row, mask, FP8_MAX, LEAST)


# The row-tiled and RoPE kernels do not specialize on their row counts and lengths (== 1, % 16): those vary
# by VAE stage, batch and prompt, and would only multiply the compiled variants (and serving-time JIT stalls)
# without changing the generated loads.
@triton.jit(do_not_specialize=["rows", "channels", "length"])
def _snake_kernel(x_ptr, alpha_ptr, out_ptr, rows, channels, length, eps, ROWS: tl.constexpr, BLOCK_T: tl.constexpr):
    # A [ROWS, BLOCK_T] tile of the (batch·channel, length) rows: early VAE stages have rows of a few samples.
    row = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    mask = (row < rows)[:, None] & (cols < length)[None, :]
    alpha = tl.load(alpha_ptr + row % channels, mask=row < rows, other=1.0).to(tl.float32)[:, None]
    offsets = row[:, None] * length + cols[None, :]
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    wave = tl.sin(alpha * x)
    out = x + (1.0 / (alpha + eps)) * (wave * wave)
    tl.store(out_ptr + offsets, out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["rows", "channels", "length", "past_length"])
def _snake_with_past_kernel(
    x_ptr,
    residual_ptr,
    alpha_ptr,
    past_ptr,
    out_ptr,
    sum_ptr,
    rows,
    channels,
    length,
    past_length,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_T: tl.constexpr,
):
    # A [ROWS, BLOCK_T] tile of the (batch·channel) output rows: past_length past frames, then length new.
    row = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    total = past_length + length
    live_row = (row < rows)[:, None]
    in_past = live_row & (cols < past_length)[None, :]
    is_new = live_row & ((cols >= past_length) & (cols < total))[None, :]
    alpha = tl.load(alpha_ptr + row % channels, mask=row < rows, other=1.0).to(tl.float32)[:, None]
    past = tl.load(past_ptr + row[:, None] * past_length + cols[None, :], mask=in_past, other=0.0).to(tl.float32)
    new = row[:, None] * length + (cols - past_length)[None, :]
    x = tl.load(x_ptr + new, mask=is_new, other=0.0)
    if HAS_RESIDUAL:
        residual = tl.load(residual_ptr + new, mask=is_new, other=0.0)
        x = (residual.to(tl.float32) + x.to(tl.float32)).to(sum_ptr.dtype.element_ty)  # one rounded add
        tl.store(sum_ptr + new, x, mask=is_new)
    x = x.to(tl.float32)
    wave = tl.sin(alpha * x)
    out = tl.where(in_past, past, x + (1.0 / (alpha + eps)) * (wave * wave))
    tl.store(
        out_ptr + row[:, None] * total + cols[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=live_row & (cols < total)[None, :],
    )


@triton.jit(do_not_specialize=["rows", "channels", "length", "stride"])
def _conv_transpose_out_kernel(
    blocks_ptr, bias_ptr, out_ptr, rows, channels, length, stride, ROWS: tl.constexpr, BLOCK_T: tl.constexpr
):
    # A [ROWS, BLOCK_T] tile of the (batch·channel) output rows of length·stride samples each.
    row = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    mask = (row < rows)[:, None] & (cols < length * stride)[None, :]
    batch, channel = row // channels, row % channels
    frame, phase = cols // stride, cols % stride
    source = ((batch[:, None] * length + frame[None, :]) * channels + channel[:, None]) * stride + phase[None, :]
    value = tl.load(blocks_ptr + source, mask=mask, other=0.0).to(tl.float32)
    bias = tl.load(bias_ptr + channel, mask=row < rows, other=0.0).to(tl.float32)[:, None]
    offsets = row[:, None] * (length * stride) + cols[None, :]
    tl.store(out_ptr + offsets, (value + bias).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["heads", "q_heads", "length"])
def _rope_kernel(
    x_ptr,
    cos_ptr,
    sin_ptr,
    q_ptr,
    k_ptr,
    heads,
    q_heads,
    length,
    stride_xb,
    stride_xh,
    stride_xt,
    stride_cb,
    stride_ct,
    stride_sb,
    stride_st,
    HEADS: tl.constexpr,
    HALF: tl.constexpr,
):
    # One program per (batch row, token): every q and k head of it as one [HEADS, HALF] tile (HEADS is
    # heads rounded up to a power of two), sharing one load of the cos/sin row.
    b = tl.program_id(0).to(tl.int64)
    t = tl.program_id(1).to(tl.int64)
    h = tl.arange(0, HEADS)
    d = tl.arange(0, HALF)
    live = (h < heads)[:, None]
    x_base = x_ptr + b * stride_xb + t * stride_xt + h[:, None] * stride_xh + d[None, :]
    x1 = tl.load(x_base, mask=live, other=0.0).to(tl.float32)
    x2 = tl.load(x_base + HALF, mask=live, other=0.0).to(tl.float32)
    c_base = cos_ptr + b * stride_cb + t * stride_ct
    s_base = sin_ptr + b * stride_sb + t * stride_st
    c1 = tl.load(c_base + d).to(tl.float32)[None, :]
    c2 = tl.load(c_base + HALF + d).to(tl.float32)[None, :]
    s1 = tl.load(s_base + d).to(tl.float32)[None, :]
    s2 = tl.load(s_base + HALF + d).to(tl.float32)[None, :]
    # x·cos + rotate_half(x)·sin with rotate_half(x) = (-x2, x1), in the reference's order of operations.
    out1 = (x1 * c1 + (-x2) * s1).to(q_ptr.dtype.element_ty)
    out2 = (x2 * c2 + x1 * s2).to(q_ptr.dtype.element_ty)
    is_q = (h < q_heads)[:, None]
    q_base = q_ptr + ((b * q_heads + h[:, None]) * length + t) * (2 * HALF) + d[None, :]
    k_base = k_ptr + ((b * (heads - q_heads) + h[:, None] - q_heads) * length + t) * (2 * HALF) + d[None, :]
    tl.store(q_base, out1, mask=is_q)
    tl.store(q_base + HALF, out2, mask=is_q)
    tl.store(k_base, out1, mask=live & ~is_q)
    tl.store(k_base + HALF, out2, mask=live & ~is_q)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x (..., N) as a (rows, N) view with a unit stride along N (a copy only if no such view exists)."""
    flat = x.reshape(-1, x.size(-1))
    return flat if flat.stride(-1) == 1 else flat.contiguous()


def _launch_rms_norm(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float, fp8_out: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """-> (normed, residual + x or None, None); with ``fp8_out`` -> (normed quantized (rows, n) float8_e4m3fn, the
    sum or None, the rows' scales (rows, 1) float32)."""
    n_cols = x.size(-1)
    if weight.shape != (n_cols,):
        raise ValueError(f"weight {tuple(weight.shape)} does not match the last dim {n_cols}")
    x2 = _rows(x)
    dtype = torch.float8_e4m3fn if fp8_out else torch.promote_types(x.dtype, weight.dtype)
    out = torch.empty(x2.shape, dtype=dtype, device=x.device)
    scale = torch.empty(x2.size(0), 1, dtype=torch.float32, device=x.device) if fp8_out else None
    residual2 = _rows(residual) if residual is not None else x2
    hidden = (
        torch.empty(x2.shape, dtype=torch.promote_types(x.dtype, residual.dtype), device=x.device)
        if (residual is not None)
        else out
    )
    _rms_norm_kernel[grids.rms_norm_grid(x2.size(0))](
        x2,
        residual2,
        weight,
        out,
        hidden,
        n_cols,
        eps,
        x2.stride(0),
        residual2.stride(0),
        out.stride(0),
        hidden.stride(0),
        out if scale is None else scale,
        HAS_RESIDUAL=residual is not None,
        FP8_OUT=fp8_out,
        FP8_MAX=FP8_MAX,
        LEAST=FP8_LEAST_AMAX,
        BLOCK=triton.next_power_of_2(n_cols),
    )
    summed = hidden.view(x.shape) if residual is not None else None
    return (out if fp8_out else out.view(x.shape)), summed, scale


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``reference.rms_norm`` in one launch (one program per row)."""
    out, _, _ = _launch_rms_norm(x, None, weight, eps)
    return out


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``reference.add_rms_norm`` in one launch: (normed, residual + x)."""
    if residual.shape != x.shape:
        raise ValueError(f"residual {tuple(residual.shape)} and x {tuple(x.shape)} differ")
    out, hidden, _ = _launch_rms_norm(x, residual, weight, eps)
    assert hidden is not None
    return out, hidden


def rms_norm_fp8(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``reference.rms_norm_fp8`` without a residual, in one launch: (q (rows, n) float8_e4m3fn, scale (rows, 1))."""
    q, _, scale = _launch_rms_norm(x, None, weight, eps, fp8_out=True)
    assert scale is not None
    return q, scale


def add_rms_norm_fp8(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``reference.rms_norm_fp8`` with a residual, in one launch: (q (rows, n) float8_e4m3fn, scale (rows, 1),
    residual + x)."""
    if residual.shape != x.shape:
        raise ValueError(f"residual {tuple(residual.shape)} and x {tuple(x.shape)} differ")
    q, hidden, scale = _launch_rms_norm(x, residual, weight, eps, fp8_out=True)
    assert scale is not None and hidden is not None
    return q, scale, hidden


def rope_qk(
    q_and_k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, q_heads: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``reference.rope_qk`` in one launch: q_and_k (B, Hq + Hkv, T, hd) with any strides (unit stride along
    hd), cos/sin (B, 1, T, hd) (broadcast strides allowed) -> contiguous q (B, Hq, T, hd), k (B, Hkv, T, hd)."""
    batch, heads, length, head_dim = q_and_k.shape
    if head_dim % 2 or (head_dim // 2) & (head_dim // 2 - 1):
        raise ValueError(f"head_dim must be twice a power of two, got {head_dim}")
    if cos.shape != (batch, 1, length, head_dim) or sin.shape != cos.shape:
        raise ValueError(f"cos/sin must be {(batch, 1, length, head_dim)}, got {tuple(cos.shape)}, {tuple(sin.shape)}")
    if q_and_k.stride(-1) != 1 or cos.stride(-1) != 1 or sin.stride(-1) != 1:
        raise ValueError("q_and_k, cos and sin must have a unit stride along head_dim")
    q = q_and_k.new_empty(batch, q_heads, length, head_dim)
    k = q_and_k.new_empty(batch, heads - q_heads, length, head_dim)
    _rope_kernel[grids.rope_grid(batch, length)](
        q_and_k,
        cos,
        sin,
        q,
        k,
        heads,
        q_heads,
        length,
        q_and_k.stride(0),
        q_and_k.stride(1),
        q_and_k.stride(2),
        cos.stride(0),
        cos.stride(2),
        sin.stride(0),
        sin.stride(2),
        HEADS=triton.next_power_of_2(heads),
        HALF=head_dim // 2,
        num_warps=_ROPE_WARPS,
    )
    return q, k


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``reference.silu_mul`` in one launch; gate and up may be the two halves of one GEMM's output."""
    if gate.shape != up.shape:
        raise ValueError(f"gate {tuple(gate.shape)} and up {tuple(up.shape)} differ")
    gate2, up2 = _rows(gate), _rows(up)
    out = torch.empty(gate2.shape, dtype=torch.promote_types(gate.dtype, up.dtype), device=gate.device)
    n_cols = gate2.size(1)
    _silu_mul_kernel[grids.silu_mul_grid(gate2.size(0), n_cols)](
        gate2, up2, out, n_cols, gate2.stride(0), up2.stride(0), out.stride(0), BLOCK=grids.ELEMENTWISE_BLOCK
    )
    return out.view(gate.shape)


def silu_mul_fp8(gate: torch.Tensor, up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``reference.silu_mul_fp8`` in one launch (one program per row): (q (rows, n) float8_e4m3fn, scale (rows,
    1) float32)."""
    if gate.shape != up.shape:
        raise ValueError(f"gate {tuple(gate.shape)} and up {tuple(up.shape)} differ")
    gate2, up2 = _rows(gate), _rows(up)
    rows, n_cols = gate2.shape
    q = torch.empty(gate2.shape, dtype=torch.float8_e4m3fn, device=gate.device)
    scale = torch.empty(rows, 1, dtype=torch.float32, device=gate.device)
    block = triton.next_power_of_2(n_cols)
    _silu_mul_fp8_kernel[grids.rms_norm_grid(rows)](
        gate2,
        up2,
        q,
        scale,
        n_cols,
        gate2.stride(0),
        up2.stride(0),
        q.stride(0),
        FP8_MAX=FP8_MAX,
        LEAST=FP8_LEAST_AMAX,
        BLOCK=block,
        num_warps=_row_warps(block),
    )
    return q, scale


def snake(x: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """``reference.snake`` in one launch: x (B, C, L), alpha (1, C, 1)."""
    if x.ndim != 3 or alpha.shape != (1, x.size(1), 1):
        raise ValueError(f"snake expects x (B, C, L) and alpha (1, C, 1), got {tuple(x.shape)}, {tuple(alpha.shape)}")
    x = x.contiguous()
    out = torch.empty(x.shape, dtype=torch.promote_types(x.dtype, alpha.dtype), device=x.device)
    batch, channels, length = x.shape
    rows = batch * channels
    grid, per_program, block_t = grids.row_tiles(rows, length)
    _snake_kernel[grid](x, alpha.reshape(-1), out, rows, channels, length, SNAKE_EPS, ROWS=per_program, BLOCK_T=block_t)
    return out


def _launch_snake_with_past(
    x: torch.Tensor, residual: torch.Tensor | None, alpha: torch.Tensor, past: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor | None]:
    if x.ndim != 3 or alpha.shape != (1, x.size(1), 1):
        raise ValueError(f"snake expects x (B, C, L) and alpha (1, C, 1), got {tuple(x.shape)}, {tuple(alpha.shape)}")
    if past.ndim != 3 or past.shape[:2] != x.shape[:2]:
        raise ValueError(f"past {tuple(past.shape)} does not match x {tuple(x.shape)} in batch and channels")
    if residual is not None and residual.shape != x.shape:
        raise ValueError(f"residual {tuple(residual.shape)} and x {tuple(x.shape)} differ")
    x, past = x.contiguous(), past.contiguous()
    residual = residual.contiguous() if residual is not None else None
    batch, channels, length = x.shape
    total = past.size(-1) + length
    out = torch.empty(batch, channels, total, dtype=torch.promote_types(x.dtype, alpha.dtype), device=x.device)
    summed = torch.empty_like(x, dtype=torch.promote_types(x.dtype, residual.dtype)) if residual is not None else None
    rows = batch * channels
    grid, per_program, block_t = grids.row_tiles(rows, total)
    _snake_with_past_kernel[grid](
        x,
        residual if residual is not None else x,
        alpha.reshape(-1),
        past,
        out,
        summed if summed is not None else x,
        rows,
        channels,
        length,
        past.size(-1),
        SNAKE_EPS,
        HAS_RESIDUAL=residual is not None,
        ROWS=per_program,
        BLOCK_T=block_t,
    )
    return out, summed


def snake_with_past(x: torch.Tensor, alpha: torch.Tensor, past: torch.Tensor) -> torch.Tensor:
    """``reference.snake_with_past`` in one launch: x (B, C, L), alpha (1, C, 1), past (B, C, P)."""
    out, _ = _launch_snake_with_past(x, None, alpha, past)
    return out


def add_snake_with_past(
    x: torch.Tensor, residual: torch.Tensor, alpha: torch.Tensor, past: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``reference.add_snake_with_past`` in one launch: (cat([past, snake(residual + x)]), residual + x)."""
    out, summed = _launch_snake_with_past(x, residual, alpha, past)
    assert summed is not None
    return out, summed


def conv_transpose_out(blocks: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``reference.conv_transpose_out`` in one launch: blocks (B, L, C, s), bias (C,) -> (B, C, L·s)."""
    if blocks.ndim != 4 or bias.shape != (blocks.size(2),):
        raise ValueError(f"expected blocks (B, L, C, s) and bias (C,), got {tuple(blocks.shape)}, {tuple(bias.shape)}")
    blocks = blocks.contiguous()
    batch, length, channels, stride = blocks.shape
    dtype = torch.promote_types(blocks.dtype, bias.dtype)
    out = torch.empty(batch, channels, length * stride, dtype=dtype, device=blocks.device)
    rows = batch * channels
    grid, per_program, block_t = grids.row_tiles(rows, length * stride)
    _conv_transpose_out_kernel[grid](
        blocks,
        bias,
        out,
        rows,
        channels,
        length,
        stride,
        ROWS=per_program,
        BLOCK_T=block_t,
        num_warps=_CONV_TRANSPOSE_OUT_WARPS,
    )
    return out


def _row_warps(block: int) -> int:
    """Warps of a one-row-per-program fp8 kernel: 8 elements a thread, 4 to 16 warps (a 4096-wide row in 16)."""
    return max(4, min(16, block // 256))


def quantize_rows_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``reference.quantize_rows_fp8`` in one launch (one program per row): x (M, K) -> (q (M, K) float8_e4m3fn,
    scale (M, 1) float32)."""
    x2 = _rows(x)
    rows, n_cols = x2.shape
    q = torch.empty(x2.shape, dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.empty(rows, 1, dtype=torch.float32, device=x.device)
    block = triton.next_power_of_2(n_cols)
    _quantize_rows_fp8_kernel[grids.rms_norm_grid(rows)](
        x2,
        q,
        scale,
        n_cols,
        x2.stride(0),
        q.stride(0),
        FP8_MAX=FP8_MAX,
        LEAST=FP8_LEAST_AMAX,
        BLOCK=block,
        num_warps=_row_warps(block),
    )
    return q, scale
