"""FP8 (e4m3) GEMMs: the row quantizer's Triton kernel (interpreted on CPU, see conftest) against its torch oracle,
the CPU emulation of ``torch._scaled_mm`` against its definition, and the dispatch: ``torch._scaled_mm`` on the fused
(CUDA) path, the emulation elsewhere."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from voxwire.kernels import fused, ops, reference

DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def randn(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.isa
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n_cols", [48, 1024, 4096])
def test_quantize_rows_kernel_equals_oracle(dtype: torch.dtype, n_cols: int, device: torch.device) -> None:
    """Bit for bit: the row maximum, the fp32 scaling and e4m3's round-to-nearest-even are all exact operations;
    an all-zero row gets zeros and a finite scale; rows of a wider tensor are read in place."""
    wide = 3 * randn(5, n_cols + 16, dtype=dtype)
    wide[2] = 0
    x = wide[:, 8 : 8 + n_cols]
    q, scale = fused.quantize_rows_fp8(x.to(device))
    expected_q, expected_scale = reference.quantize_rows_fp8(x)
    assert q.dtype == torch.float8_e4m3fn and scale.shape == (5, 1)
    assert torch.equal(q.cpu().view(torch.uint8), expected_q.view(torch.uint8))
    assert torch.equal(scale.cpu(), expected_scale)
    assert torch.isfinite(scale).all() and not q.cpu()[2].float().any()


@pytest.mark.isa
def test_quantize_rows_keeps_each_rows_largest_value() -> None:
    """The largest magnitude of every row lands on 448 (e4m3's largest finite value), so nothing saturates, and the
    dequantized row is within e4m3's half step (2^-4 relative) of the input."""
    x = randn(6, 256) * torch.logspace(-3, 3, 6)[:, None]
    q, scale = reference.quantize_rows_fp8(x)
    assert torch.equal(q.float().abs().amax(dim=1), torch.full((6,), 448.0))
    dequantized = q.float() * scale
    # Normal e4m3 values carry 3 mantissa bits; below 2^-6 * scale the subnormal step 2^-9 * scale bounds the error.
    bound = torch.maximum(x.abs() * 2.0**-4, scale * 2.0**-10)
    assert ((dequantized - x).abs() <= bound).all()


def test_scaled_mm_emulation_is_the_scaled_product_rounded_once() -> None:
    """The emulation's output is the exact fp8 products summed, scaled by the row and column scales, rounded once
    to bf16: checked against float64 arithmetic of the same fp8 values (the fp32 sum differs by ulps of fp32, far
    below a bf16 step)."""
    x, weight = randn(7, 64, seed=1), randn(24, 64, seed=2)
    q, scale = reference.quantize_rows_fp8(x)
    wq, wscale = ops.quantize_weight_fp8(weight)
    got = reference.scaled_mm(q, wq, scale, wscale, torch.bfloat16)
    exact = (q.double() @ wq.double().t()) * scale.double() * wscale.double()
    torch.testing.assert_close(got.float(), exact.to(torch.bfloat16).float(), atol=0, rtol=2**-8)


def test_fp8_linear_error_is_e4m3s() -> None:
    """Against the bf16 product of the unquantized operands: inputs and weights each carry e4m3's error (2^-4
    relative at most, ~2.6 % RMS of a value spread over a binade), so over K = 512 random terms the output's RMS
    error is a few percent of its RMS: above bf16's 0.4 % step, below 6 %."""
    x, weight = randn(32, 512, dtype=torch.bfloat16, seed=3), randn(96, 512, dtype=torch.bfloat16, seed=4)
    got = ops.fp8_linear(x.view(4, 8, 512), *ops.quantize_weight_fp8(weight))
    exact = x.double() @ weight.double().t()
    assert got.shape == (4, 8, 96) and got.dtype == torch.bfloat16
    relative = ((got.view(32, 96).double() - exact).pow(2).mean() / exact.pow(2).mean()).sqrt().item()
    assert 2**-8 < relative < 0.06


@pytest.mark.skipif(not hasattr(torch, "_scaled_mm"), reason="torch has no _scaled_mm")
def test_emulation_agrees_with_torchs_cpu_scaled_mm_where_it_has_one() -> None:
    """Where this torch runs ``_scaled_mm`` on CPU, its output equals the emulation's to within one bf16 step (the
    summation order may differ)."""
    x, weight = randn(9, 128, seed=5), randn(32, 128, seed=6)
    q, scale = reference.quantize_rows_fp8(x)
    wq, wscale = ops.quantize_weight_fp8(weight)
    try:
        native = torch._scaled_mm(q, wq.t(), scale_a=scale, scale_b=wscale, out_dtype=torch.bfloat16)
    except (RuntimeError, NotImplementedError) as exc:
        pytest.skip(f"no CPU _scaled_mm with row-wise scales here: {exc}")
    emulated = reference.scaled_mm(q, wq, scale, wscale, torch.bfloat16)
    torch.testing.assert_close(native.float(), emulated.float(), atol=1e-6, rtol=2**-7)


class _Ops(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.names.append(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


def test_fused_path_dispatches_scaled_mm() -> None:
    """On the fused path (meta as CUDA) an fp8 linear is the row quantizer's custom op and one ``_scaled_mm``; off it
    (CPU) no ``_scaled_mm`` is dispatched (the emulation's fp32 product instead)."""
    weight = torch.empty(64, 32, device="meta", dtype=torch.bfloat16)
    wq, wscale = ops.quantize_weight_fp8(weight)
    x = torch.empty(3, 5, 32, device="meta", dtype=torch.bfloat16)
    with ops.fused_on_meta(), _Ops() as seen:
        out = ops.fp8_linear(x, wq, wscale)
    assert out.shape == (3, 5, 64) and out.dtype == torch.bfloat16
    assert "voxwire.quantize_rows_fp8" in seen.names and "aten._scaled_mm" in seen.names
    with _Ops() as seen:
        ops.fp8_linear(
            randn(3, 32, dtype=torch.bfloat16), *ops.quantize_weight_fp8(randn(64, 32, dtype=torch.bfloat16))
        )
    assert "aten._scaled_mm" not in seen.names and "voxwire.quantize_rows_fp8" not in seen.names


@pytest.mark.isa
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_fp8_kernel_equals_oracle(dtype: torch.dtype, with_residual: bool, device: torch.device) -> None:
    """The norm that writes its output quantized: the same bits as the norm, rounded to the activation dtype, then
    quantized (``reference.rms_norm_fp8``); the residual sum as ``add_rms_norm``'s."""
    x, weight = randn(2, 3, 1024, dtype=dtype), randn(1024, dtype=dtype, seed=1)
    residual = randn(2, 3, 1024, dtype=dtype, seed=2) if with_residual else None
    if residual is None:
        q, scale = fused.rms_norm_fp8(x.to(device), weight.to(device), 1e-5)
        hidden = x
    else:
        q, scale, hidden = fused.add_rms_norm_fp8(x.to(device), residual.to(device), weight.to(device), 1e-5)
    expected_q, expected_scale, expected_hidden = reference.rms_norm_fp8(x, weight, 1e-5, residual)
    if device.type == "cpu" and dtype == torch.bfloat16:
        # The interpreter rounds fp32 -> bf16 toward zero (tests/kernels/test_fused.py): compare the quantizer on
        # the interpreter's own normed values instead.
        normed = (
            fused.add_rms_norm(x, residual, weight, 1e-5)[0]
            if residual is not None
            else fused.rms_norm(x, weight, 1e-5)
        )
        expected_q, expected_scale = reference.quantize_rows_fp8(normed.reshape(-1, 1024))
        expected_hidden = hidden.cpu() if residual is None else fused.add_rms_norm(x, residual, weight, 1e-5)[1]
    assert torch.equal(q.cpu().view(torch.uint8), expected_q.view(torch.uint8))
    assert torch.equal(scale.cpu(), expected_scale) and torch.equal(hidden.cpu(), expected_hidden)


@pytest.mark.isa
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_silu_mul_fp8_kernel_equals_oracle(dtype: torch.dtype, device: torch.device) -> None:
    """SiLU*mul written quantized, a 4096-wide row per program (the DiT's down projection input), from the two
    halves of a gate/up GEMM output."""
    gate, up = randn(3, 2 * 4096, dtype=dtype).chunk(2, dim=-1)
    q, scale = fused.silu_mul_fp8(gate.to(device), up.to(device))
    product = fused.silu_mul(gate, up) if device.type == "cpu" else reference.silu_mul(gate, up)
    expected_q, expected_scale = reference.quantize_rows_fp8(product)
    assert torch.equal(q.cpu().view(torch.uint8), expected_q.view(torch.uint8))
    assert torch.equal(scale.cpu(), expected_scale)
