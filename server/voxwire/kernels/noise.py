"""A request's CFM noise in one launch: the numbers of ``calls`` patch-by-patch ``torch.randn`` draws on CUDA.

The seed contract (``voxwire.sampling``) fixes a request's noise as the reference draws it: one
``torch.randn((1, D, P))`` per patch from a CUDA generator seeded with the request's seed. A request may
take 100-200 patches, and drawing them ahead at admission as 100-200 launches of a 256-element kernel
costs more stream time than the numbers do. One ``torch.randn`` of all the patches at once draws other
numbers (CUDA's threads map to elements differently in a bigger launch), so the audio would change.

This kernel computes, in one launch, exactly what those small launches compute. For a float ``randn`` of
N elements (N at most one element per thread the device can hold at once, which a patch always is)
torch's CUDA generator gives element j the first normal of a Philox4x32-10 state set up by
``curand_init(seed, subsequence=j, offset)``: the Box-Muller sine of the first two 32-bit words Philox
returns for key ``seed`` and counter ``(offset / 4, j)``. Each call then moves the generator's offset on
by 4, so the k-th call after seeding reads counter ``(k, j)``. The Box-Muller step repeats curand's
float operations one by one (an FMA for each uniform, an IEEE ``logf`` and ``sqrtf``, the fast sine);
the result is rounded to the output dtype as torch's kernel rounds it.

Whether the bits really agree on a device is not assumed: ``kernels.path`` compares this kernel with
eager draws once per device at start-up and keeps the patch-by-patch draws where they differ.

Import only where Triton is meant to run (CUDA, or the interpreter tests).
"""

from __future__ import annotations

import os

import numpy as np
import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

CALL_OFFSET = 4
"""How far one small ``randn`` moves a CUDA generator's Philox offset (one 4-word Philox output per thread)."""

MAX_CALL_ELEMENTS = 1 << 14
"""The largest call this reproduces: far below one element per resident thread on any GPU torch supports
(one for each of 2,048 threads of 16 SMs), beyond which torch's threads draw several elements each."""

# curand's Box-Muller constants, as float32 values (their C definitions are float expressions).
_TWO_POW_32_INV = float(np.float32(2.3283064e-10))
_TWO_POW_32_INV_2PI = float(np.float32(2.3283064e-10) * np.float32(6.2831855))

_BLOCK = 1024

# The interpreter runs no libdevice: there numpy's float32 log and sine stand in (a few ulp from CUDA's), so the
# interpreter tests check the counters, the layout and the roundings, and the start-up probe checks the bits.
_INTERPRETED = tl.constexpr(os.environ.get("TRITON_INTERPRET") == "1")


@triton.jit
def _logf(x):
    if _INTERPRETED:
        return tl.log(x)
    else:
        return libdevice.log(x)  # curand's logf: IEEE-accurate, not the fast __logf


@triton.jit
def _fast_sinf(x):
    if _INTERPRETED:
        return tl.sin(x)
    else:
        return libdevice.fast_sinf(x)  # curand's __sincosf


@triton.jit
def _join(lo, hi):
    """The int64 whose halves are these two int32 bit patterns."""
    return (hi.to(tl.int64) << 32) | lo.to(tl.uint32, bitcast=True).to(tl.int64)


@triton.jit(do_not_specialize=["seed_lo", "seed_hi", "first_lo", "first_hi", "call_elements", "total"])
def _patch_noise_kernel(
    out_ptr,
    seed_lo,
    seed_hi,
    first_lo,
    first_hi,
    call_elements,
    total,
    INV: tl.constexpr,
    INV_2PI: tl.constexpr,
    BLOCK: tl.constexpr,
):
    index = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = index < total
    seed = _join(seed_lo, seed_hi)
    call = _join(first_lo, first_hi) + index // call_elements  # which randn call, counted from the seeding
    element = index % call_elements  # which thread of that call: its Philox subsequence
    zero = tl.zeros_like(element).to(tl.uint32)
    x, y, _, _ = tl.philox(
        seed,
        call.to(tl.uint32),  # the counter's low 64 bits: the call's offset / 4
        (call >> 32).to(tl.uint32),
        element.to(tl.uint32),  # its high 64 bits: the subsequence
        zero,
    )
    u = tl.fma(x.to(tl.float32), INV, INV / 2)
    v = tl.fma(y.to(tl.float32), INV_2PI, INV_2PI / 2)
    radius = tl.sqrt_rn(-2.0 * _logf(u))
    tl.store(
        out_ptr + index, (_fast_sinf(v) * radius).to(out_ptr.dtype.element_ty, fp_downcast_rounding="rtne"), mask=mask
    )


def patch_noise(
    seed: int, first_call: int, calls: int, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """``(calls, *shape)``: calls ``first_call`` .. ``first_call + calls - 1`` of ``torch.randn(shape)`` on a CUDA
    generator seeded with ``seed`` (``seed`` in [0, 2**63); a float ``dtype``; at most ``MAX_CALL_ELEMENTS`` a call)."""
    call_elements = int(np.prod(shape))
    if not 0 < call_elements <= MAX_CALL_ELEMENTS:
        raise ValueError(f"a call of {call_elements} elements is not one element per thread")
    out = torch.empty((calls, *shape), dtype=dtype, device=device)
    total = out.numel()
    if total:
        grid = (triton.cdiv(total, _BLOCK),)
        _patch_noise_kernel[grid](
            out, *_halves(seed), *_halves(first_call), call_elements, total, _TWO_POW_32_INV, _TWO_POW_32_INV_2PI,
            BLOCK=_BLOCK,
        )  # fmt: skip
    return out


def _halves(value: int) -> tuple[int, int]:
    """A 64-bit ``value`` as two int32 bit patterns. Triton types an int argument by its value (int32, or int64
    from 2**31), so whole seeds would compile a second kernel at the first request whose seed crosses that line,
    in the engine's loop; halves keep every call on the kernel the start-up probe compiled."""
    return _int32(value & 0xFFFFFFFF), _int32((value >> 32) & 0xFFFFFFFF)


def _int32(bits: int) -> int:
    return bits - (1 << 32) if bits >= 1 << 31 else bits
