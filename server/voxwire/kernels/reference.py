"""The plain-torch definitions of the fused ops: the CPU path of the model and the kernels' test oracles.

Each follows the model's operation order and intermediate roundings exactly (a bf16 model rounds where
these functions round), so routing the model through them changes no bit on CPU.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Snake's guard against alpha = 0, as the VAE checkpoints were trained with.
SNAKE_EPS = 1e-9


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """MiniCPM's RMSNorm over the last dim: statistics in fp32, the normalised value rounded to x's dtype
    before the weight (the product is fp32 by promotion, then rounded)."""
    variance = x.to(torch.float32).pow(2).mean(dim=-1, keepdim=True)
    return (x * torch.rsqrt(variance + eps)).to(x.dtype) * weight


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``h = residual + x`` (in their dtype) -> (rms_norm(h), h): a pre-norm block's residual add and the
    next norm in one op."""
    hidden = residual + x
    return rms_norm(hidden, weight, eps), hidden


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, heads, T, hd) rotated in fp32 and returned in its own dtype; cos/sin broadcast to it."""
    x32 = x.to(torch.float32)
    return (x32 * cos + _rotate_half(x32) * sin).to(x.dtype)


def rope_qk(
    q_and_k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, q_heads: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """q_and_k (B, Hq + Hkv, T, hd), any strides -> RoPE-rotated q (B, Hq, T, hd) and k (B, Hkv, T, hd),
    both contiguous. One rotation for both: elementwise, so each value is what rotating q and k apart gives."""
    q, k = apply_rope(q_and_k, cos, sin).split([q_heads, q_and_k.size(1) - q_heads], dim=1)
    return q.contiguous(), k.contiguous()


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool) -> torch.Tensor:
    """Self-attention with GQA: q (B, Hq, T, hd), k and v (B, Hkv, T, hd) -> (B, Hq, T, hd), scaled by 1/sqrt(hd)."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, enable_gqa=True)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """The gated MLP's ``silu(gate) * up`` (silu rounded to the dtype before the product)."""
    return F.silu(gate) * up


def snake(x: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """The VAE's Snake ``x + sin²(αx) / (α + 1e-9)``, x (B, C, L), alpha (1, C, 1); the reference's order of
    operations (reciprocal, then product)."""
    return x + torch.reciprocal(alpha + SNAKE_EPS) * torch.sin(alpha * x).pow(2)


def snake_with_past(x: torch.Tensor, alpha: torch.Tensor, past: torch.Tensor) -> torch.Tensor:
    """``cat([past, snake(x)])`` along time: a streaming causal conv's input (its past frames, then the
    activated new ones), x (B, C, L), past (B, C, P) -> (B, C, P + L)."""
    return torch.cat([past, snake(x, alpha)], dim=-1)


def add_snake_with_past(
    x: torch.Tensor, residual: torch.Tensor, alpha: torch.Tensor, past: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``h = residual + x`` -> (snake_with_past(h), h): a residual unit's add and the next unit's first Snake
    in one op."""
    hidden = residual + x
    return snake_with_past(hidden, alpha, past), hidden


def conv_transpose_out(blocks: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """A transposed conv's output from its per-frame blocks: blocks (B, L, C, s), output block l of every
    channel -> (B, C, L·s) channels-first, plus bias (C,)."""
    batch, _, channels, _ = blocks.shape
    return blocks.permute(0, 2, 1, 3).reshape(batch, channels, -1) + bias[:, None]


# float8_e4m3fn's largest finite magnitude: a row's largest value is scaled onto it.
FP8_MAX = 448.0
# The least row maximum a scale is taken from: an all-zero row gets a finite scale (and quantizes to zeros).
FP8_LEAST_AMAX = 1e-30


def quantize_rows_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (M, K) -> (q (M, K) float8_e4m3fn, scale (M, 1) float32), x ~ q * scale: each row scaled in fp32 so its
    largest magnitude lands on ``FP8_MAX``, then rounded to nearest (even) e4m3."""
    x32 = x.to(torch.float32)
    amax = x32.abs().amax(dim=-1, keepdim=True).clamp(min=FP8_LEAST_AMAX)
    # A correctly rounded quotient (``FP8_MAX / amax`` would be the reciprocal times 448: rounded twice).
    inverse = torch.full_like(amax, FP8_MAX) / amax
    q = (x32 * inverse).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, amax / FP8_MAX


def scaled_mm(
    q: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, weight_scale: torch.Tensor, out_dtype: torch.dtype
) -> torch.Tensor:
    """``torch._scaled_mm(q, weight.t(), scale, weight_scale, out_dtype=out_dtype)`` as CUDA computes it: q (M, K)
    and weight (N, K) float8_e4m3fn, their products summed in fp32, the sum times the row's ``scale`` (M, 1) and the
    column's ``weight_scale`` (1, N) in fp32, rounded once to ``out_dtype`` -> (M, N). (fp8 products are exact in
    fp32; only the summation order differs from the GPU's.)"""
    return ((q.to(torch.float32) @ weight.to(torch.float32).t()) * scale * weight_scale).to(out_dtype)


def rms_norm_fp8(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``rms_norm`` of ``residual + x`` (of x without a residual), quantized for an fp8 GEMM: x (..., n) ->
    (q (rows, n) float8_e4m3fn, scale (rows, 1) float32, the sum (x without a residual))."""
    if residual is None:
        normed, hidden = rms_norm(x, weight, eps), x
    else:
        normed, hidden = add_rms_norm(x, residual, weight, eps)
    q, scale = quantize_rows_fp8(normed.reshape(-1, normed.size(-1)))
    return q, scale, hidden


def silu_mul_fp8(gate: torch.Tensor, up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``silu_mul`` quantized for an fp8 GEMM: (..., n) -> (q (rows, n) float8_e4m3fn, scale (rows, 1) float32)."""
    product = silu_mul(gate, up)
    return quantize_rows_fp8(product.reshape(-1, product.size(-1)))
