"""The fused ops the model calls: Triton kernels (as ``torch.ops.voxwire`` custom ops) on CUDA when
``kernels.path`` chose Triton for the device, the plain torch definitions of ``reference`` everywhere
else, so the CPU path is plain torch and bit-for-bit what it was before fusion.

``fused_on_meta`` routes meta tensors to the custom ops too, so a meta-device count of the step sees
the CUDA path (one launch per fused op) rather than the reference's chain of ops.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple, overload

import torch

from voxwire.kernels import grids, reference
from voxwire.kernels.path import uses_triton

_fused_meta = False


@contextmanager
def fused_on_meta(enabled: bool = True) -> Iterator[None]:
    """Within the block, meta tensors take the fused (CUDA) path when ``enabled``."""
    global _fused_meta
    previous, _fused_meta = _fused_meta, enabled
    try:
        yield
    finally:
        _fused_meta = previous


def _fused(x: torch.Tensor) -> bool:
    # On CUDA as ``kernels.path`` decided for the device, together with decode attention.
    if (x.is_cuda and uses_triton(x.device)) or (_fused_meta and x.is_meta):
        import voxwire.kernels.custom_ops  # noqa: F401  (registers torch.ops.voxwire)

        return True
    return False


@overload
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: None = None) -> torch.Tensor: ...


@overload
def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]: ...


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm of x over its last dim; with ``residual``, of ``residual + x``, returned with that sum:
    ``(normed, residual + x)``."""
    if residual is None:
        return torch.ops.voxwire.rms_norm(x, weight, eps) if _fused(x) else reference.rms_norm(x, weight, eps)
    if _fused(x):
        return torch.ops.voxwire.add_rms_norm(x, residual, weight, eps)
    return reference.add_rms_norm(x, residual, weight, eps)


def rope_qk(
    q_and_k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, q_heads: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE on q and k stacked along heads: q_and_k (B, Hq + Hkv, T, hd) -> contiguous q, k; cos/sin
    broadcast to (B, 1, T, hd) (a (T, hd) table, or (B, 1, 1, hd) per-row positions)."""
    if _fused(q_and_k):
        batch, _, length, head_dim = q_and_k.shape
        table = (batch, 1, length, head_dim)
        return torch.ops.voxwire.rope_qk(q_and_k, cos.expand(table), sin.expand(table), q_heads)
    return reference.rope_qk(q_and_k, cos, sin, q_heads)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool) -> torch.Tensor:
    """A sequence's self-attention with GQA: q (B, Hq, T, hd), k and v (B, Hkv, T, hd) -> (B, Hq, T, hd). A
    bidirectional one whose heads and tokens fit one tile (LocDiT's, LocEnc's) runs the small-sequence kernel on the
    fused path, SDPA otherwise (every causal prefill). Its output is then a transposed view of (B, T, Hq, hd), as
    flash attention's is."""
    group = q.size(1) // k.size(1)
    if not is_causal and grids.small_attention_tile(group, q.size(2), q.size(3)) is not None and _fused(q):
        return torch.ops.voxwire.small_attention(q, k, v, q.size(-1) ** -0.5).transpose(1, 2)
    return reference.attention(q, k, v, is_causal)


def fuses_rope_attention(like: torch.Tensor, q_heads: int, kv_heads: int, length: int, head_dim: int) -> bool:
    """Whether a bidirectional attention of this shape, on ``like``'s device, runs RoPE inside the small-sequence
    kernel (``rope_attention``): the fused path, a shape the kernel's tile holds, and a half-precision model (a
    float32 model is an exactness check, gpu_check's: its [128, 128] tiles would not rotate within the registers)."""
    fits = grids.small_attention_tile(q_heads // kv_heads, length, head_dim) is not None
    return fits and like.dtype != torch.float32 and _fused(like)


def rope_attention(
    q_and_k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, q_heads: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``rope_qk`` then a bidirectional ``attention`` in one launch of the small-sequence kernel (where
    ``fuses_rope_attention``): q_and_k (B, Hq + Hkv, T, hd) before RoPE, v (B, Hkv, T, hd), cos/sin (T, hd) -> (the
    attention output (B, Hq, T, hd), a transposed view of (B, T, Hq, hd); the rotated k (B, Hkv, T, hd))."""
    out, k = torch.ops.voxwire.small_rope_attention(q_and_k, v, cos, sin, q_heads, q_and_k.size(-1) ** -0.5)
    return out.transpose(1, 2), k


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up``."""
    return torch.ops.voxwire.silu_mul(gate, up) if _fused(gate) else reference.silu_mul(gate, up)


def snake(x: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """The VAE's Snake activation, x (B, C, L), alpha (1, C, 1)."""
    return torch.ops.voxwire.snake(x, alpha) if _fused(x) else reference.snake(x, alpha)


@overload
def snake_with_past(
    x: torch.Tensor, alpha: torch.Tensor, past: torch.Tensor, residual: None = None
) -> torch.Tensor: ...


@overload
def snake_with_past(
    x: torch.Tensor, alpha: torch.Tensor, past: torch.Tensor, residual: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]: ...


def snake_with_past(
    x: torch.Tensor, alpha: torch.Tensor, past: torch.Tensor, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``cat([past, snake(x)], dim=-1)``, x (B, C, L), alpha (1, C, 1), past (B, C, P): the Snake written
    straight into a streaming conv's input, without materialising it on its own first. With ``residual``,
    of ``residual + x``, returned with that sum: ``(extended, residual + x)``."""
    if residual is None:
        if _fused(x):
            return torch.ops.voxwire.snake_with_past(x, alpha, past)
        return reference.snake_with_past(x, alpha, past)
    if _fused(x):
        return torch.ops.voxwire.add_snake_with_past(x, residual, alpha, past)
    return reference.add_snake_with_past(x, residual, alpha, past)


def conv_transpose_out(blocks: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """blocks (B, L, C, s) -> (B, C, L·s) + bias (C,): the layout change and the bias add in one pass."""
    if _fused(blocks):
        return torch.ops.voxwire.conv_transpose_out(blocks, bias)
    return reference.conv_transpose_out(blocks, bias)


def quantize_rows_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (M, K) -> (q (M, K) float8_e4m3fn, scale (M, 1) float32), x ~ q * scale row by row
    (``reference.quantize_rows_fp8``; one Triton launch on the fused path)."""
    return torch.ops.voxwire.quantize_rows_fp8(x) if _fused(x) else reference.quantize_rows_fp8(x)


def quantize_weight_fp8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A linear layer's weight (N, K) -> (q (N, K) float8_e4m3fn, scale (1, N) float32): one scale per output
    channel, in the layout ``torch._scaled_mm`` takes for its second operand's."""
    q, scale = reference.quantize_rows_fp8(weight)
    return q, scale.view(1, -1)


class QuantizedRows(NamedTuple):
    """An activation quantized for an fp8 GEMM by the op that made it (``rms_norm_fp8``, ``silu_mul_fp8``): its rows
    ``q`` (rows, n) float8_e4m3fn and ``scale`` (rows, 1) float32, and the activation's own ``shape`` (..., n) and
    ``dtype`` (the GEMM's output dtype)."""

    q: torch.Tensor
    scale: torch.Tensor
    shape: torch.Size
    dtype: torch.dtype


def rms_norm_fp8(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[QuantizedRows, torch.Tensor]:
    """``rms_norm`` (of ``residual + x`` with ``residual``) quantized for an fp8 GEMM, in one launch on the fused
    path -> (the normed rows quantized, ``residual + x`` or x)."""
    if not _fused(x):
        q, scale, hidden = reference.rms_norm_fp8(x, weight, eps, residual)
    elif residual is None:
        (q, scale), hidden = torch.ops.voxwire.rms_norm_fp8(x, weight, eps), x
    else:
        q, scale, hidden = torch.ops.voxwire.add_rms_norm_fp8(x, residual, weight, eps)
    return QuantizedRows(q, scale, x.shape, x.dtype), hidden


def silu_mul_fp8(gate: torch.Tensor, up: torch.Tensor) -> QuantizedRows:
    """``silu(gate) * up`` quantized for an fp8 GEMM (one launch on the fused path)."""
    q, scale = torch.ops.voxwire.silu_mul_fp8(gate, up) if _fused(gate) else reference.silu_mul_fp8(gate, up)
    return QuantizedRows(q, scale, gate.shape, gate.dtype)


def fp8_linear(x: torch.Tensor | QuantizedRows, weight: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
    """``F.linear(x, w)`` with w ~ ``weight`` (N, K) float8_e4m3fn times ``weight_scale`` (1, N) (from
    ``quantize_weight_fp8``) and x (..., K) quantized per row here, or already (``QuantizedRows``):
    ``torch._scaled_mm`` on CUDA (and on meta, where the step counter prices it), its emulation
    (``reference.scaled_mm``) elsewhere -> (..., N) in the activation's dtype."""
    if isinstance(x, QuantizedRows):
        q, scale, shape, dtype = x
    else:
        q, scale = quantize_rows_fp8(x.reshape(-1, x.size(-1)))
        shape, dtype = x.shape, x.dtype
    if q.is_cuda or q.is_meta:
        out = torch._scaled_mm(q, weight.t(), scale_a=scale, scale_b=weight_scale, out_dtype=dtype)
    else:
        out = reference.scaled_mm(q, weight, scale, weight_scale, dtype)
    return out.view(*shape[:-1], weight.size(0))
