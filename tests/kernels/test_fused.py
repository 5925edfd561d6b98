"""The fused Triton kernels (interpreted on CPU, see conftest) against their plain-torch definitions, and the
dispatch layer: plain torch off CUDA, one custom op per fused op where the fused path is selected."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from voxwire.kernels import fused, ops, reference

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def randn(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def assert_matches(got: torch.Tensor, expected: torch.Tensor) -> None:
    """fp32: to 1e-5. Half types: within two steps of the output dtype. The kernels round where the model
    rounds, but fp32 results may differ in the last bits, and the interpreter rounds fp32 -> bf16 toward
    zero where CUDA (and torch) round to nearest, so a value can land on the neighbouring bf16."""
    assert got.dtype == expected.dtype and got.shape == expected.shape
    if expected.dtype == torch.float32:
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    else:
        eps = torch.finfo(expected.dtype).eps
        torch.testing.assert_close(got.float(), expected.float(), atol=2 * eps, rtol=2 * eps)


def on(device: torch.device, kernel, *tensors: torch.Tensor, **options):
    """Run ``kernel`` on ``device`` (see conftest) with the tensors moved there; outputs back on the CPU."""
    out = kernel(*(t.to(device) for t in tensors), **options)
    return tuple(t.cpu() for t in out) if isinstance(out, tuple) else out.cpu()


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm(dtype: torch.dtype, device: torch.device) -> None:
    x, weight = randn(2, 3, 48, dtype=dtype), randn(48, dtype=dtype, seed=1)
    assert_matches(on(device, fused.rms_norm, x, weight, eps=1e-5), reference.rms_norm(x, weight, 1e-5))


@pytest.mark.isa
@pytest.mark.parametrize("dtype", DTYPES)
def test_add_rms_norm(dtype: torch.dtype, device: torch.device) -> None:
    x, residual, weight = randn(5, 40, dtype=dtype), randn(5, 40, dtype=dtype, seed=1), randn(40, dtype=dtype, seed=2)
    normed, hidden = on(device, fused.add_rms_norm, x, residual, weight, eps=1e-6)
    expected_normed, expected_hidden = reference.add_rms_norm(x, residual, weight, 1e-6)
    if dtype == torch.bfloat16 and device.type == "cpu":
        assert_matches(hidden, expected_hidden)  # the interpreter's bf16 rounding, see assert_matches
    else:
        assert torch.equal(hidden, expected_hidden)  # one rounded add: exact
    assert_matches(normed, expected_normed)


def test_rms_norm_reads_strided_rows(device: torch.device) -> None:
    """Rows of a wider tensor (a GEMM output's slice) are normalised in place of a contiguous copy."""
    wide, weight = randn(4, 64).to(device), randn(32, seed=1).to(device)
    got = fused.rms_norm(wide[:, 16:48], weight, 1e-5).cpu()
    assert_matches(got, reference.rms_norm(wide[:, 16:48].cpu(), weight.cpu(), 1e-5))


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul_on_gemm_halves(dtype: torch.dtype, device: torch.device) -> None:
    """gate and up as the two halves of one gate/up GEMM output, longer than one kernel block."""
    gate_up = randn(3, 2, 2 * 1100, dtype=dtype)
    got = fused.silu_mul(*gate_up.to(device).chunk(2, dim=-1)).cpu()
    assert_matches(got, reference.silu_mul(*gate_up.chunk(2, dim=-1)))


@pytest.mark.parametrize("dtype", DTYPES)
def test_snake(dtype: torch.dtype, device: torch.device) -> None:
    """Computed in fp32 and rounded once: for half types the oracle is the fp32 definition, rounded (torch
    in half precision rounds five times and is itself several steps off)."""
    x = 3 * randn(2, 5, 1500, dtype=dtype)
    alpha = (0.05 + torch.rand(1, 5, 1, generator=torch.Generator().manual_seed(1))).to(dtype)
    assert_matches(on(device, fused.snake, x, alpha), reference.snake(x.float(), alpha.float()).to(dtype))


@pytest.mark.isa
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("past_frames", [1, 54, 1100])
def test_snake_with_past(dtype: torch.dtype, past_frames: int, device: torch.device) -> None:
    """The past frames copied unchanged, then the activated new ones: a streaming conv's input, past and new
    parts each shorter or longer than one kernel block."""
    x = 3 * randn(2, 5, 700, dtype=dtype)
    alpha = (0.05 + torch.rand(1, 5, 1, generator=torch.Generator().manual_seed(1))).to(dtype)
    past = randn(2, 5, past_frames, dtype=dtype, seed=2)
    got = on(device, fused.snake_with_past, x, alpha, past)
    assert torch.equal(got[..., :past_frames], past)
    expected = reference.snake_with_past(x.float(), alpha.float(), past.float()).to(dtype)
    assert_matches(got, expected)


@pytest.mark.isa
@pytest.mark.parametrize("dtype", DTYPES)
def test_add_snake_with_past(dtype: torch.dtype, device: torch.device) -> None:
    """A residual unit's add, returned, and the next unit's first Snake on the sum behind the past frames."""
    x, residual = 3 * randn(2, 5, 1100, dtype=dtype), 3 * randn(2, 5, 1100, dtype=dtype, seed=3)
    alpha = (0.05 + torch.rand(1, 5, 1, generator=torch.Generator().manual_seed(1))).to(dtype)
    past = randn(2, 5, 54, dtype=dtype, seed=2)
    extended, summed = on(device, fused.add_snake_with_past, x, residual, alpha, past)
    expected_sum = reference.add_snake_with_past(x, residual, alpha, past)[1]
    if dtype == torch.bfloat16 and device.type == "cpu":
        assert_matches(summed, expected_sum)  # the interpreter's bf16 rounding, see assert_matches
    else:
        assert torch.equal(summed, expected_sum)  # one rounded add: exact
    # The Snake of the sum, computed in fp32 and rounded once (see test_snake).
    assert_matches(extended, reference.snake_with_past(summed.float(), alpha.float(), past.float()).to(dtype))


@pytest.mark.isa
@pytest.mark.parametrize("dtype", DTYPES)
def test_conv_transpose_out(dtype: torch.dtype, device: torch.device) -> None:
    """Blocks of 5 samples per frame laid out channels-first, more samples per row than one kernel block;
    one rounded add per sample: exact."""
    blocks, bias = randn(2, 250, 3, 5, dtype=dtype), randn(3, dtype=dtype, seed=1)
    got = on(device, fused.conv_transpose_out, blocks, bias)
    expected = reference.conv_transpose_out(blocks, bias)
    if dtype == torch.bfloat16 and device.type == "cpu":
        assert_matches(got, expected)  # the interpreter's bf16 rounding, see assert_matches
    else:
        assert torch.equal(got, expected)


# (batch, channels, samples per row, past frames): the VAE's row shapes, from one-sample rows (a 2048-channel
# stage at L = 1) through rows that fill several rows per program to rows longer than one 1024-sample block,
# with row counts that leave the last program's tile part empty.
ROW_SHAPES = [(3, 37, 1, 6), (2, 45, 5, 18), (1, 7, 60, 54), (2, 3, 1030, 6)]


@pytest.mark.isa
@pytest.mark.parametrize(("batch", "channels", "length", "past_frames"), ROW_SHAPES)
def test_row_tiled_snake_kernels_at_vae_row_shapes(
    batch: int, channels: int, length: int, past_frames: int, device: torch.device
) -> None:
    """Snake, Snake-with-past and its residual form tile [rows, samples] per program: every row and sample,
    none twice, whatever the row length."""
    x, residual = 3 * randn(batch, channels, length), 3 * randn(batch, channels, length, seed=3)
    alpha = 0.05 + torch.rand(1, channels, 1, generator=torch.Generator().manual_seed(1))
    past = randn(batch, channels, past_frames, seed=2)
    assert_matches(on(device, fused.snake, x, alpha), reference.snake(x, alpha))
    assert_matches(on(device, fused.snake_with_past, x, alpha, past), reference.snake_with_past(x, alpha, past))
    extended, summed = on(device, fused.add_snake_with_past, x, residual, alpha, past)
    expected_extended, expected_sum = reference.add_snake_with_past(x, residual, alpha, past)
    assert torch.equal(summed, expected_sum)
    assert_matches(extended, expected_extended)


@pytest.mark.isa
@pytest.mark.parametrize(("batch", "length", "channels", "stride"), [(3, 1, 37, 5), (2, 2, 40, 8), (1, 1, 5, 256)])
def test_conv_transpose_out_at_vae_row_shapes(
    batch: int, length: int, channels: int, stride: int, device: torch.device
) -> None:
    """Short output rows (one or two frames of an early upsampling stage) tiled several to a program."""
    blocks, bias = randn(batch, length, channels, stride), randn(channels, seed=1)
    assert torch.equal(on(device, fused.conv_transpose_out, blocks, bias), reference.conv_transpose_out(blocks, bias))


@pytest.mark.parametrize(("q_heads", "kv_heads", "head_dim"), [(16, 2, 128), (12, 2, 64), (3, 1, 32)])
@pytest.mark.parametrize("per_row_positions", [False, True])
def test_rope_qk_all_heads_of_a_token_in_one_program(
    q_heads: int, kv_heads: int, head_dim: int, per_row_positions: bool, device: torch.device
) -> None:
    """The stacks' head counts (18 and 14 heads: not powers of two, so the head tile is part masked) and head
    dims; q and k land in their own contiguous outputs."""
    batch, length = 2, 1 if per_row_positions else 3
    qkv = randn(batch, length, (q_heads + 2 * kv_heads) * head_dim, dtype=torch.bfloat16)
    q_and_k = qkv.view(batch, length, -1, head_dim).transpose(1, 2)[:, : q_heads + kv_heads]
    table_shape = (batch, 1, 1, head_dim) if per_row_positions else (length, head_dim)
    cos, sin = randn(*table_shape, seed=1), randn(*table_shape, seed=2)
    expected_q, expected_k = reference.rope_qk(q_and_k, cos, sin, q_heads)
    table = (batch, 1, length, head_dim)
    q, k = fused.rope_qk(*(t.to(device) for t in (q_and_k, cos.expand(table), sin.expand(table))), q_heads)
    assert_matches(q.cpu(), expected_q)
    assert_matches(k.cpu(), expected_k)


def test_snake_tiny_alpha_uses_the_epsilon(device: torch.device) -> None:
    """alpha = 0 is finite through the 1e-9 guard, exactly as the VAE computes it."""
    x, alpha = randn(1, 2, 8), torch.tensor([[[0.0], [1e-12]]])
    got = on(device, fused.snake, x, alpha)
    assert torch.isfinite(got).all()
    assert_matches(got, reference.snake(x, alpha))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("per_row_positions", [False, True])
def test_rope_qk(dtype: torch.dtype, per_row_positions: bool, device: torch.device) -> None:
    """q and k stacked along heads in a q/k/v GEMM output (strided), with a (T, hd) table (LocEnc/LocDiT) or
    per-row positions (B, 1, 1, hd) (a decode step)."""
    batch, q_heads, kv_heads, head_dim = 3, 4, 2, 16
    length = 1 if per_row_positions else 5
    qkv = randn(batch, length, (q_heads + 2 * kv_heads) * head_dim, dtype=dtype)
    q_and_k = qkv.view(batch, length, -1, head_dim).transpose(1, 2)[:, : q_heads + kv_heads]
    table_shape = (batch, 1, 1, head_dim) if per_row_positions else (length, head_dim)
    cos, sin = randn(*table_shape, dtype=dtype, seed=1), randn(*table_shape, dtype=dtype, seed=2)
    expected_q, expected_k = reference.rope_qk(q_and_k, cos, sin, q_heads)
    table = (batch, 1, length, head_dim)
    q_and_k, cos, sin = (t.to(device) for t in (q_and_k, cos, sin))
    q, k = fused.rope_qk(q_and_k, cos.expand(table), sin.expand(table), q_heads)
    assert q.is_contiguous() and k.is_contiguous()
    q, k = q.cpu(), k.cpu()
    assert_matches(q, expected_q)
    assert_matches(k, expected_k)


def test_bad_shapes_raise() -> None:
    with pytest.raises(ValueError, match="weight"):
        fused.rms_norm(randn(2, 8), randn(7), 1e-5)
    with pytest.raises(ValueError, match="differ"):
        fused.silu_mul(randn(2, 8), randn(2, 9))
    with pytest.raises(ValueError, match="alpha"):
        fused.snake(randn(1, 3, 8), randn(1, 4, 1))
    with pytest.raises(ValueError, match="bias"):
        fused.conv_transpose_out(randn(1, 4, 3, 2), randn(2))
    with pytest.raises(ValueError, match="past"):
        fused.snake_with_past(randn(1, 3, 8), randn(1, 3, 1), randn(1, 4, 2))
    with pytest.raises(ValueError, match="differ"):
        fused.add_snake_with_past(randn(1, 3, 8), randn(1, 3, 7), randn(1, 3, 1), randn(1, 3, 2))


class OpNames(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


@pytest.mark.isa
def test_cpu_tensors_take_the_plain_torch_path() -> None:
    x, weight = randn(2, 8), randn(8, seed=1)
    with OpNames() as seen:
        out = ops.rms_norm(x, weight, 1e-5)
    assert torch.equal(out, reference.rms_norm(x, weight, 1e-5))
    assert not any(name.startswith("voxwire") for name in seen.names)


def test_fused_on_meta_is_one_op_each() -> None:
    meta = torch.device("meta")
    x, weight = torch.empty(2, 3, 8, device=meta), torch.empty(8, device=meta)
    alpha, past = torch.empty(1, 3, 1, device=meta), torch.empty(2, 3, 6, device=meta)
    blocks, bias = torch.empty(2, 4, 3, 5, device=meta), torch.empty(3, device=meta)
    cos, q_and_k = torch.empty(3, 4, device=meta), torch.empty(2, 6, 3, 4, device=meta)
    with ops.fused_on_meta(), OpNames() as seen:
        ops.rms_norm(x, weight, 1e-5)
        normed, hidden = ops.rms_norm(x, weight, 1e-5, residual=x)
        ops.silu_mul(x, x)
        ops.snake(x, alpha)
        extended = ops.snake_with_past(x, alpha, past)
        added, summed = ops.snake_with_past(x, alpha, past, residual=x)
        upsampled = ops.conv_transpose_out(blocks, bias)
        q, k = ops.rope_qk(q_and_k, cos, cos, 4)
    launched = [name for name in seen.names if not name.startswith("aten.expand")]
    fused_ops = (
        "rms_norm",
        "add_rms_norm",
        "silu_mul",
        "snake",
        "snake_with_past",
        "add_snake_with_past",
        "conv_transpose_out",
        "rope_qk",
    )
    assert launched == [f"voxwire.{op}" for op in fused_ops]
    assert extended.shape == added.shape == (2, 3, 14) and summed.shape == x.shape and upsampled.shape == (2, 3, 20)
    assert normed.shape == hidden.shape == x.shape
    assert q.shape == (2, 4, 3, 4) and k.shape == (2, 2, 3, 4)
