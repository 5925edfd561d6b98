"""The VAE's causal transposed convolution runs as one GEMM over every frame of the batch (issue 34, D1), with the
samples the batched-GEMM formulation it replaced gave."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from voxwire.kernels import reference
from voxwire.model.audio_vae import CausalConvTranspose1d


def layer(dtype: torch.dtype = torch.float32, device: str = "cpu") -> CausalConvTranspose1d:
    """A stage of VoxCPM2's decoder at a small width: 64 -> 32 channels, upsampling by 5."""
    torch.manual_seed(0)
    with torch.device(device):
        return CausalConvTranspose1d(64, 32, stride=5).to(dtype).eval()


def as_batched_gemm(conv: CausalConvTranspose1d, x: torch.Tensor) -> torch.Tensor:
    """The formulation before issue 34: (frame, previous frame) pairs as a transposed view, which ``matmul``
    runs as one GEMM per batch element."""
    batch, _, length = x.shape
    extended = torch.nn.functional.pad(x, (1, 0))
    pairs = torch.cat([extended[..., 1:], extended[..., :-1]], dim=1).transpose(1, 2)
    blocks = (pairs @ conv.packed_weight).view(batch, length, conv.out_channels, conv.stride[0])
    return reference.conv_transpose_out(blocks, conv.bias)


@pytest.mark.isa
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize(("batch", "frames"), [(3, 4), (5, 8)])
def test_one_gemm_gives_the_batched_gemms_samples_bit_for_bit(
    threads: int, dtype: torch.dtype, batch: int, frames: int
) -> None:
    """At 4 frames per element and more (a VoxCPM2 patch and every later stage). Below 4, MKL's float32 GEMM
    computes a per-element GEMM of so few rows with another kernel whose sums run in another order: the samples
    then differ in the last bits, within the reference-parity tolerance (tests/model/test_audio_vae.py)."""
    conv = layer(dtype)
    x = torch.randn(batch, conv.in_channels, frames, generator=torch.Generator().manual_seed(threads)).to(dtype)
    with torch.no_grad():
        assert torch.equal(conv(x), as_batched_gemm(conv, x))


class _Ops(TorchDispatchMode):
    """Records every aten op with its arguments."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def __torch_dispatch__(
        self, func: Callable[..., Any], types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        self.calls.append((str(func.overloadpacket.__name__), args))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_the_weight_is_read_by_one_mm_not_broadcast_to_a_bmm(device: str) -> None:
    """On CUDA a bmm over a stride-0 weight reads the whole weight once per batch element (67 MB for 4 frames
    of each of 768 streams at VoxCPM2's first stage); one mm reads it once for all of them."""
    conv = layer(device=device)
    x = torch.randn(6, conv.in_channels, 4, device=device)
    with torch.no_grad(), _Ops() as seen:
        conv(x)
    names = [name for name, _ in seen.calls]
    assert "bmm" not in names and "expand" not in names, names
    gemms = [args for name, args in seen.calls if name in ("mm", "addmm", "matmul")]
    assert len(gemms) == 1, names
    rows, weight = gemms[0][-2:]
    assert rows.shape == (6 * 4, 2 * conv.in_channels)
    assert weight.shape == conv.packed_weight.shape and weight.stride() == conv.packed_weight.stride()
