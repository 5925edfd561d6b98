"""Exact (float64) results of the ops the numerics tests check, and bounds from rounding-error analysis on how far
a float32 computation of them may lie from the exact result, on any CPU or GPU.

A tolerance taken from how accurate one machine's kernels happen to be (a multiple of the plain op's own error, an
atol that held here) passes or fails with the CPU's GEMM blocking, vector width and thread count: on an Intel
AVX-512 CPU the plain 1-row GEMM came out 4x more accurate than a 48-row one, and a test holding the second to twice
the first's error failed there. The bounds below hold for any order of summation, any blocking, any vector width and
with or without fused multiply-add, so they hold for every correct float32 kernel.

Notation (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., sections 2.2 and 3.1): u is the unit
roundoff (2**-24 in float32, 2**-53 in float64), every basic operation is exact times (1 + d) with |d| <= u, and
gamma_n = n u / (1 - n u). A product of n factors (1 + d_i)^(+-1) is 1 + t with |t| <= gamma_n (Lemma 3.1).

The exact result is computed in float64 from the same float32 inputs (exactly representable), so it is itself within
the same bound with u = 2**-53; the helpers add that term, twice (once more for the float64 magnitude it is scaled by,
whose relative error is as small), so the bounds compare a float32 result with the float64 one rigorously. No
underflow is assumed: the tests' values are of order one.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

U32 = 2.0**-24
"""Unit roundoff of float32."""
U64 = 2.0**-53
"""Unit roundoff of float64."""


def gamma(n: torch.Tensor | float, unit_roundoff: float = U32) -> torch.Tensor | float:
    """Higham's gamma_n = n u / (1 - n u): the relative error of n roundings, elementwise for a tensor of counts."""
    return n * unit_roundoff / (1 - n * unit_roundoff)


def rounding_bound(roundings: torch.Tensor | float) -> torch.Tensor | float:
    """The relative bound of ``roundings`` float32 roundings, plus as many in the float64 reference (see above)."""
    return gamma(roundings, U32) + 2 * gamma(roundings, U64)


def assert_within(computed: torch.Tensor, exact: torch.Tensor, bound: torch.Tensor) -> None:
    """|computed - exact| <= bound, elementwise; the message names the worst element against its bound."""
    assert computed.shape == exact.shape == bound.shape, (computed.shape, exact.shape, bound.shape)
    error = (computed.double() - exact).abs()
    excess = error - bound
    worst = int(excess.argmax())
    assert bool((excess <= 0).all()), (
        f"|computed - exact| = {error.flatten()[worst]:.3g} exceeds its bound {bound.flatten()[worst]:.3g} "
        f"(element {worst}; largest error {error.max():.3g})"
    )


def sum_of_products_reference(
    op: Callable[..., torch.Tensor], *operands: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact result of ``op(*operands)`` and the bound on a float32 computation's error, elementwise.

    ``op`` must compute each output as a sum of products of two operand elements and of single operand elements (a
    bias): a linear layer, a matmul, a convolution. Each output s = sum_{i=1..n} a_i b_i, summed in float32 in any
    order, with each product rounded or fused into its addition, is sum_i a_i b_i (1 + t_i): term i passes through its
    product's rounding and at most n - 1 additions, so |t_i| <= gamma_n, and

        |fl(s) - s| <= gamma_n * sum_i |a_i b_i|                                   (Higham (3.5))

    A bias is one more term (b * 1, exact). Both n and sum_i |a_i b_i| come from ``op`` itself, run in float64: on
    ones it counts each output's terms (zero padding adds none), on the operands' absolute values it gives the sum.
    """
    exact = op(*(operand.detach().double() for operand in operands))
    magnitude = op(*(operand.detach().double().abs() for operand in operands))
    terms = op(*(torch.ones_like(operand, dtype=torch.float64) for operand in operands))
    return exact, rounding_bound(terms) * magnitude


SILU_ROUNDINGS = 7
"""silu(x) computed as x / (1 + exp(-x)) or x * (1 / (1 + exp(-x))). An exp within 2 ulps (4 u relative; float32 exp
is within 1 ulp in glibc and Sleef) perturbs 1 + exp(-x) by at most 4 u times exp(-x) / (1 + exp(-x)) < 1; the
addition rounds once, the division (and the product) once each: 7 roundings' worth at most."""


def silu_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact silu of ``x`` and the bound on a float32 computation's error, elementwise (``SILU_ROUNDINGS``)."""
    exact = F.silu(x.double())
    return exact, rounding_bound(SILU_ROUNDINGS) * exact.abs()


def attention_error_bound(
    query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, weights: torch.Tensor, scale: float
) -> torch.Tensor:
    """The bound on a float32 attention output's error, for one row: query (H, D), keys and values (L, H, D) (the
    row's positions, GQA already expanded), weights (H, L) the exact softmax. Elementwise over (H, D).

    Any algorithm of this shape: scores s_l = scale q.k_l, weights exp(s_l - m) for a running maximum m (one pass,
    or chunk by chunk with each earlier partial sum rescaled by exp(m_old - m_new): an online softmax in C <= L
    chunks), then sum_l w_l v_l / sum_l w_l. With S = max_l scale sum_d |q_d k_ld| (so |s_l| <= S) and
    V_d = sum_l p_l |v_ld|, to first order in u:

    * a score is a D-term dot product and at most 4 more roundings (the scale's to float32 and its product, or
      sqrt(scale)'s applied to q and to k, as SDPA's math backend does): |ds_l| <= (D + 4) u S, which moves each
      exact weight p_l by a relative 2 (D + 4) u S at most (numerator and normalizer);
    * each exp argument is rounded twice at most (the subtraction; a product by log2(e) where exp is exp2): 2 u |x|
      with |x| <= 2 S, and exp itself is within 4 u. A weight's own exp and the rescales after its chunk (whose
      arguments add up to m_final - m_own <= 2 S, each rescale one exp and one product) give it a relative error
      <= 8 u S + 4 u + 5 u C, which moves its normalized weight by twice that;
    * the L products w_l v_ld and the two sums of at most L terms: L u + (L - 1) u, and the division: u.

    |computed_d - exact_d| <= u ((2 D + 24) S + 10 C + 2 L + 8) V_d <= u ((2 D + 24) S + 12 (L + 1)) V_d. The
    neglected terms are of second order: below 0.1% of the bound while its relative factor is below 1e-3 (asserted).
    """
    positions, _, dim = keys.shape
    reach = torch.einsum("hd,lhd->hl", query.abs(), keys.abs()).amax(dim=-1) * scale  # S, per head
    spread = torch.einsum("hl,lhd->hd", weights, values.abs())  # V
    factor = (U32 + 2 * U64) * ((2 * dim + 24) * reach + 12 * (positions + 1))
    assert float(factor.max()) < 1e-3, "the first-order analysis needs a relative factor well below 1"
    return factor[:, None] * spread


def paged_attention_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Paged decode attention row by row in float64: softmax(q K^T * scale) V over the row's first seq_len positions
    (zeros for a row with none), and the bound on a float32 computation's error (``attention_error_bound``)."""
    batch, q_heads, dim = q.shape
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    exact = torch.zeros(batch, q_heads, dim, dtype=torch.float64)
    bound = torch.zeros_like(exact)
    for row in range(batch):
        length = int(seq_lens[row])
        if not length:
            continue
        positions = torch.arange(length)
        blocks = tables[row, positions // block_size].long()
        group = q_heads // kv_heads
        keys = k_cache[blocks, positions % block_size].double().repeat_interleave(group, dim=1)  # (L, Hq, D)
        values = v_cache[blocks, positions % block_size].double().repeat_interleave(group, dim=1)
        query = q[row].double()
        weights = (torch.einsum("hd,lhd->hl", query, keys) * scale).softmax(dim=-1)
        exact[row] = torch.einsum("hl,lhd->hd", weights, values)
        bound[row] = attention_error_bound(query, keys, values, weights, scale)
    return exact, bound


def weight_norm_fold_bound(length: int) -> float:
    """The relative bound on g v / ||v|| - v in float32 when g = ||v|| too, computed by another kernel (another
    summation order) over ``length`` elements.

    A sum of squares is a dot product of a vector with itself: relative error gamma_n (see
    ``sum_of_products_reference``); its square root halves that and rounds once, so each norm is within gamma_n / 2
    + u and their ratio within gamma_n + 2 u. Folding rounds the ratio (or 1 / ||v||) and its product with v (or two
    products): at most 3 more roundings, so gamma_{n + 5} in all."""
    return float(gamma(length + 5))
