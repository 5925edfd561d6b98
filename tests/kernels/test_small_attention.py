"""The small-sequence attention Triton kernel (interpreted on CPU, see conftest) that LocDiT and LocEnc run on CUDA:
against SDPA computed exactly (float64) within the rounding-error bound of the kernel's arithmetic, at both sequence
lengths VoxCPM2 runs, rows independent of their batch to the bit, and chosen by ``ops.attention`` only where it
applies."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from tests.bounds import attention_error_bound
from torch.utils._python_dispatch import TorchDispatchMode

from voxwire.kernels import grids, ops
from voxwire.kernels.batch_invariant import batch_invariant
from voxwire.kernels.small_attention import small_attention

KV_HEADS = 2
GROUP = 8  # every VoxCPM stack: 16 query heads over 2 kv heads
# (tokens, head dim): VoxCPM2's LocDiT (2 mu tokens, time, 4 cond and 4 noisy patch frames) and LocEnc (CLS and a
# patch of 4), and VoxCPM-0.5B's LocDiT (mu + time, 2 + 2 frames) at its head dim.
SHAPES = [(11, 128), (5, 128), (5, 64)]


def make_case(batch: int, length: int, head_dim: int, dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """q, k, v as the model hands them over: q and k contiguous (out of RoPE), v a strided view of the fused q/k/v
    projection's output."""
    generator = torch.Generator().manual_seed(seed)
    q_heads = GROUP * KV_HEADS
    qkv = torch.randn(batch, length, q_heads + 2 * KV_HEADS, head_dim, generator=generator).to(dtype).transpose(1, 2)
    q, k, v = qkv.split([q_heads, KV_HEADS, KV_HEADS], dim=1)
    return q.contiguous(), k.contiguous(), v


def run_kernel(case: tuple[torch.Tensor, ...], device: torch.device) -> torch.Tensor:
    """The kernel's output as SDPA's layout (B, Hq, T, hd), back on the CPU."""
    q, k, v = (t.to(device) for t in case)
    return small_attention(q, k, v, q.size(-1) ** -0.5).transpose(1, 2).cpu()


def exact_and_bound(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """SDPA in float64 on the same inputs (exact to far below the tolerance), and the bound on the kernel's error.

    The kernel's fp32 arithmetic (scores, softmax, the weighted sum of values, the division) is any one-pass softmax
    of tests/bounds.py's ``attention_error_bound``: B32 per query (row, token), one chunk. With half-precision inputs
    the kernel also rounds the unnormalized weights w_l to the inputs' dtype before their product with the values (as
    SDPA does) and rounds the output once. Each such conversion is within one ulp, a relative e (the dtype's eps:
    bf16 2**-7, fp16 2**-10); round-to-nearest on a GPU gives half that, Triton's interpreter truncates to bf16. The
    first moves the numerator sum_l w_l v_ld by at most e sum_l w_l |v_ld|, so the output by e V_d (V_d = sum_l p_l
    |v_ld|); the second adds e |out_d|. So |kernel_d - exact_d| <= B32 + e (V_d + |exact_d|), to first order; the
    second-order terms (e B32, e^2 V_d, e V_d times B32's relative factor, which is below 1e-3) are below 2 e of it,
    so the bound is (1 + 2 e) (B32 + e (V_d + |exact_d|)). fp32 inputs round nothing more: e = 0."""
    q64, k64, v64 = q.double(), k.double(), v.double()
    scale = q.size(-1) ** -0.5
    exact = F.scaled_dot_product_attention(q64, k64, v64, scale=scale, enable_gqa=True)
    keys, values = (t.repeat_interleave(GROUP, dim=1).permute(0, 2, 1, 3) for t in (k64, v64))  # (B, T, Hq, hd)
    ulp = 0.0 if q.dtype == torch.float32 else torch.finfo(q.dtype).eps
    bound = torch.empty_like(exact)
    for row in range(q.size(0)):
        for token in range(q.size(2)):
            query = q64[row, :, token]
            weights = (torch.einsum("hd,lhd->hl", query, keys[row]) * scale).softmax(dim=-1)
            spread = torch.einsum("hl,lhd->hd", weights, values[row].abs())
            b32 = attention_error_bound(query, keys[row], values[row], weights, scale)
            bound[row, :, token] = (1 + 2 * ulp) * (b32 + ulp * (spread + exact[row, :, token].abs()))
    return exact, bound


def assert_within(computed: torch.Tensor, exact: torch.Tensor, bound: torch.Tensor) -> None:
    error = (computed.double() - exact).abs()
    assert bool((error <= bound).all()), f"largest error {error.max():.3g}, worst excess {(error - bound).max():.3g}"


@pytest.mark.isa
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize(("length", "head_dim"), SHAPES, ids=["dit", "locenc", "0.5b-dit"])
@pytest.mark.parametrize("batch", [1, 3])
def test_kernel_is_sdpa_within_its_rounding_error(
    batch: int, length: int, head_dim: int, dtype: torch.dtype, device: torch.device
) -> None:
    case = make_case(batch, length, head_dim, dtype, seed=batch)
    got = run_kernel(case, device)
    assert got.dtype == dtype and got.shape == case[0].shape
    assert_within(got, *exact_and_bound(*case))


@pytest.mark.isa
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(("length", "head_dim"), SHAPES[:2], ids=["dit", "locenc"])
def test_a_rows_output_does_not_depend_on_its_batch(
    length: int, head_dim: int, dtype: torch.dtype, device: torch.device
) -> None:
    """In batch-invariant mode (and out of it: one program per (row, kv head) reads its own row only) a row's output
    is the same bits alone, among 4 others and among 6 different others."""
    q, k, v = make_case(5, length, head_dim, dtype, seed=1)
    others = make_case(6, length, head_dim, dtype, seed=2)
    with batch_invariant():
        alone = run_kernel((q[2:3], k[2:3], v[2:3]), device)
        among_its_batch = run_kernel((q, k, v), device)[2:3]
        mixed = tuple(torch.cat([rest[:4], mine[2:3], rest[4:]]) for rest, mine in zip(others, (q, k, v), strict=True))
        among_others = run_kernel(mixed, device)
    assert torch.equal(among_its_batch, alone)
    assert torch.equal(among_others[4:5], alone)


class OpNames(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(
        self, func: Callable[..., Any], types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        self.names.append(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(
    ("length", "is_causal", "kernel"),
    [(11, False, True), (5, False, True), (11, True, False), (17, False, False)],
    ids=["dit", "locenc", "causal-prefill", "too-long"],
)
def test_the_fused_path_runs_the_kernel_where_it_applies(length: int, is_causal: bool, kernel: bool) -> None:
    """On the CUDA path (meta stands in): a bidirectional sequence whose 8 heads x tokens fit one tile runs the
    kernel, as a transposed view of (B, T, Hq, hd) (the output projection reads it without a copy); a causal one or
    one too long for a tile runs SDPA."""
    meta = torch.device("meta")
    q = torch.empty(3, GROUP * KV_HEADS, length, 128, device=meta, dtype=torch.bfloat16)
    k = v = torch.empty(3, KV_HEADS, length, 128, device=meta, dtype=torch.bfloat16)
    with ops.fused_on_meta(), OpNames() as seen:
        out = ops.attention(q, k, v, is_causal)
    assert ("voxwire.small_attention" in seen.names) is kernel, seen.names
    assert out.shape == q.shape
    if kernel:
        assert out.transpose(1, 2).is_contiguous()


@pytest.mark.isa
def test_the_cpu_path_is_sdpa() -> None:
    """Off CUDA nothing changes: SDPA, bit for bit, and no custom op."""
    q, k, v = make_case(2, 11, 64, torch.bfloat16)
    with OpNames() as seen:
        out = ops.attention(q, k, v, is_causal=False)
    assert torch.equal(out, F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
    assert not any(name.startswith("voxwire") for name in seen.names)


def test_the_tile_stacks_a_rows_heads() -> None:
    """VoxCPM2's DiT: 8 heads x 11 tokens in 128 query rows against 16 keys; LocEnc: 40 rows in 64."""
    assert grids.small_attention_tile(GROUP, 11, 128) == (128, 16)
    assert grids.small_attention_tile(GROUP, 5, 128) == (64, 16)
    assert grids.small_attention_tile(GROUP, 17, 128) is None
    assert grids.small_attention_tile(GROUP, 5, 12) is None and grids.small_attention_tile(GROUP, 5, 256) is None


@pytest.mark.parametrize(
    ("q_shape", "kv_shape", "message"),
    [
        ((2, 16, 5, 64), (2, 3, 5, 64), "multiple"),
        ((2, 16, 5, 64), (2, 2, 4, 64), r"\(B, Hkv, T, hd\)"),
        ((2, 16, 17, 64), (2, 2, 17, 64), "do not fit"),
        ((2, 16, 5, 48), (2, 2, 5, 48), "do not fit"),
    ],
)
def test_bad_shapes_raise(q_shape: tuple[int, ...], kv_shape: tuple[int, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        small_attention(torch.zeros(q_shape), torch.zeros(kv_shape), torch.zeros(kv_shape), 1.0)


@pytest.mark.isa
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize(("length", "head_dim"), SHAPES, ids=["dit", "locenc", "0.5b-dit"])
def test_rope_inside_the_kernel_equals_rope_then_attention(
    dtype: torch.dtype, length: int, head_dim: int, device: torch.device
) -> None:
    """``small_rope_attention`` rotates q and k as it loads them, with the RoPE kernel's arithmetic: its output and
    its rotated k are the bits of ``fused.rope_qk`` followed by ``small_attention``, from the q/k/v GEMM's output
    (strided) and a (T, hd) table."""
    from voxwire.kernels import fused
    from voxwire.kernels.small_attention import small_rope_attention

    generator = torch.Generator().manual_seed(7)
    q_heads = GROUP * KV_HEADS
    qkv = torch.randn(2, length, q_heads + 2 * KV_HEADS, head_dim, generator=generator).to(dtype).transpose(1, 2)
    q_and_k, v = (t.to(device) for t in qkv.split([q_heads + KV_HEADS, KV_HEADS], dim=1))
    angles = torch.randn(length, head_dim, generator=generator)
    cos, sin = (table.to(dtype).to(device) for table in (angles.cos(), angles.sin()))
    scale = head_dim**-0.5
    out, k = small_rope_attention(q_and_k, v, cos, sin, q_heads, scale)
    table = (2, 1, length, head_dim)
    q_rotated, k_rotated = fused.rope_qk(q_and_k, cos.expand(table), sin.expand(table), q_heads)
    assert torch.equal(k.cpu(), k_rotated.cpu())
    assert torch.equal(out.cpu(), small_attention(q_rotated, k_rotated, v, scale).cpu())
