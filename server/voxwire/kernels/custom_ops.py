"""The fused ops as torch custom ops (``torch.ops.voxwire.*``): a CUDA implementation that launches the
Triton kernel, and a shape-only implementation for meta and fake tensors.

Going through the dispatcher makes each fused op one node wherever torch looks (CUDA graphs, the
meta-device step counter, ``torch.compile``), and keeps Triton out of the import path: ``fused`` is
imported on the first CUDA call.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _empty(x: Tensor, other: Tensor) -> Tensor:
    return torch.empty(x.shape, dtype=torch.promote_types(x.dtype, other.dtype), device=x.device)


@torch.library.custom_op("voxwire::rms_norm", mutates_args=(), device_types="cuda")
def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    from voxwire.kernels import fused

    return fused.rms_norm(x, weight, eps)


@rms_norm.register_fake
def _(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return _empty(x, weight)


@torch.library.custom_op("voxwire::add_rms_norm", mutates_args=(), device_types="cuda")
def add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    from voxwire.kernels import fused

    return fused.add_rms_norm(x, residual, weight, eps)


@add_rms_norm.register_fake
def _(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    return _empty(x, weight), _empty(x, residual)


@torch.library.custom_op("voxwire::rope_qk", mutates_args=(), device_types="cuda")
def rope_qk(q_and_k: Tensor, cos: Tensor, sin: Tensor, q_heads: int) -> tuple[Tensor, Tensor]:
    from voxwire.kernels import fused

    return fused.rope_qk(q_and_k, cos, sin, q_heads)


@rope_qk.register_fake
def _(q_and_k: Tensor, cos: Tensor, sin: Tensor, q_heads: int) -> tuple[Tensor, Tensor]:
    batch, heads, length, head_dim = q_and_k.shape
    q = q_and_k.new_empty(batch, q_heads, length, head_dim)
    return q, q_and_k.new_empty(batch, heads - q_heads, length, head_dim)


@torch.library.custom_op("voxwire::silu_mul", mutates_args=(), device_types="cuda")
def silu_mul(gate: Tensor, up: Tensor) -> Tensor:
    from voxwire.kernels import fused

    return fused.silu_mul(gate, up)


@silu_mul.register_fake
def _(gate: Tensor, up: Tensor) -> Tensor:
    return _empty(gate, up)


@torch.library.custom_op("voxwire::snake", mutates_args=(), device_types="cuda")
def snake(x: Tensor, alpha: Tensor) -> Tensor:
    from voxwire.kernels import fused

    return fused.snake(x, alpha)


@snake.register_fake
def _(x: Tensor, alpha: Tensor) -> Tensor:
    return _empty(x, alpha)


@torch.library.custom_op("voxwire::snake_with_past", mutates_args=(), device_types="cuda")
def snake_with_past(x: Tensor, alpha: Tensor, past: Tensor) -> Tensor:
    from voxwire.kernels import fused

    return fused.snake_with_past(x, alpha, past)


def _extended(x: Tensor, alpha: Tensor, past: Tensor) -> Tensor:
    batch, channels, length = x.shape
    return x.new_empty(batch, channels, past.size(-1) + length, dtype=torch.promote_types(x.dtype, alpha.dtype))


@snake_with_past.register_fake
def _(x: Tensor, alpha: Tensor, past: Tensor) -> Tensor:
    return _extended(x, alpha, past)


@torch.library.custom_op("voxwire::add_snake_with_past", mutates_args=(), device_types="cuda")
def add_snake_with_past(x: Tensor, residual: Tensor, alpha: Tensor, past: Tensor) -> tuple[Tensor, Tensor]:
    from voxwire.kernels import fused

    return fused.add_snake_with_past(x, residual, alpha, past)


@add_snake_with_past.register_fake
def _(x: Tensor, residual: Tensor, alpha: Tensor, past: Tensor) -> tuple[Tensor, Tensor]:
    return _extended(x, alpha, past), _empty(x, residual)


@torch.library.custom_op("voxwire::conv_transpose_out", mutates_args=(), device_types="cuda")
def conv_transpose_out(blocks: Tensor, bias: Tensor) -> Tensor:
    from voxwire.kernels import fused

    return fused.conv_transpose_out(blocks, bias)


@conv_transpose_out.register_fake
def _(blocks: Tensor, bias: Tensor) -> Tensor:
    batch, length, channels, stride = blocks.shape
    return blocks.new_empty(batch, channels, length * stride, dtype=torch.promote_types(blocks.dtype, bias.dtype))


@torch.library.custom_op("voxwire::small_attention", mutates_args=(), device_types="cuda")
def small_attention(q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
    from voxwire.kernels import small_attention as kernel

    return kernel.small_attention(q, k, v, scale)


@small_attention.register_fake
def _(q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
    batch, heads, length, head_dim = q.shape
    return q.new_empty(batch, length, heads, head_dim)


@torch.library.custom_op("voxwire::quantize_rows_fp8", mutates_args=(), device_types="cuda")
def quantize_rows_fp8(x: Tensor) -> tuple[Tensor, Tensor]:
    from voxwire.kernels import fused

    return fused.quantize_rows_fp8(x)


@quantize_rows_fp8.register_fake
def _(x: Tensor) -> tuple[Tensor, Tensor]:
    rows, n_cols = x.shape
    return x.new_empty(rows, n_cols, dtype=torch.float8_e4m3fn), x.new_empty(rows, 1, dtype=torch.float32)


@torch.library.custom_op("voxwire::rms_norm_fp8", mutates_args=(), device_types="cuda")
def rms_norm_fp8(x: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    from voxwire.kernels import fused

    return fused.rms_norm_fp8(x, weight, eps)


@rms_norm_fp8.register_fake
def _(x: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    return _quantized(x)


@torch.library.custom_op("voxwire::add_rms_norm_fp8", mutates_args=(), device_types="cuda")
def add_rms_norm_fp8(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor, Tensor]:
    from voxwire.kernels import fused

    return fused.add_rms_norm_fp8(x, residual, weight, eps)


@add_rms_norm_fp8.register_fake
def _(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor, Tensor]:
    q, scale = _quantized(x)
    return q, scale, _empty(x, residual)


@torch.library.custom_op("voxwire::silu_mul_fp8", mutates_args=(), device_types="cuda")
def silu_mul_fp8(gate: Tensor, up: Tensor) -> tuple[Tensor, Tensor]:
    from voxwire.kernels import fused

    return fused.silu_mul_fp8(gate, up)


@silu_mul_fp8.register_fake
def _(gate: Tensor, up: Tensor) -> tuple[Tensor, Tensor]:
    return _quantized(gate)


def _quantized(x: Tensor) -> tuple[Tensor, Tensor]:
    """The shapes of x (..., n) quantized per row: (rows, n) float8_e4m3fn and (rows, 1) float32 scales."""
    rows = x.numel() // x.size(-1)
    return x.new_empty(rows, x.size(-1), dtype=torch.float8_e4m3fn), x.new_empty(rows, 1, dtype=torch.float32)


@torch.library.custom_op("voxwire::small_rope_attention", mutates_args=(), device_types="cuda")
def small_rope_attention(
    q_and_k: Tensor, v: Tensor, cos: Tensor, sin: Tensor, q_heads: int, scale: float
) -> tuple[Tensor, Tensor]:
    from voxwire.kernels import small_attention as kernel

    return kernel.small_rope_attention(q_and_k, v, cos, sin, q_heads, scale)


@small_rope_attention.register_fake
def _(q_and_k: Tensor, v: Tensor, cos: Tensor, sin: Tensor, q_heads: int, scale: float) -> tuple[Tensor, Tensor]:
    batch, heads, length, head_dim = q_and_k.shape
    out = q_and_k.new_empty(batch, length, q_heads, head_dim)
    return out, q_and_k.new_empty(batch, heads - q_heads, length, head_dim)
