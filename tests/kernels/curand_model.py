"""What torch's CUDA ``randn`` computes, modelled in numpy, so the one-launch noise kernel has an oracle on CPU.

A float ``torch.randn`` of n elements on CUDA (n at most one element per resident thread) gives element j
the first normal of ``curand_init(seed, subsequence=j, offset)`` for the generator's Philox offset, and
then moves that offset on by 4. curand's first normal of a Philox4x32-10 state is the Box-Muller sine of
the first two words Philox returns for key ``seed`` and counter ``(offset / 4, j)``.

The model follows curand's float operations (an FMA for each uniform, ``logf``, ``sqrtf``); numpy's float32
``log`` and ``sin`` stand in for CUDA's, so it matches a GPU's numbers to a few ulp, not bit for bit.
"""

from __future__ import annotations

import numpy as np

_ROUND_A, _ROUND_B = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_KEY_A, _KEY_B = np.uint32(0x9E3779B9), np.uint32(0xBB67AE85)
_INV = np.float32(2.3283064e-10)
_INV_2PI = np.float32(np.float32(2.3283064e-10) * np.float32(6.2831855))


def philox4x32_10(counter: list[np.ndarray], key: tuple[int, int]) -> list[np.ndarray]:
    """Philox4x32 with 10 rounds over arrays of counters (four uint32 words each) under one 64-bit key."""
    c0, c1, c2, c3 = (np.asarray(word, dtype=np.uint32) for word in counter)
    k0, k1 = np.uint32(key[0]), np.uint32(key[1])
    for round_ in range(10):
        product_a = _ROUND_A * c0.astype(np.uint64)
        product_b = _ROUND_B * c2.astype(np.uint64)
        c0, c1, c2, c3 = (
            (product_b >> np.uint64(32)).astype(np.uint32) ^ c1 ^ k0,
            product_b.astype(np.uint32),
            (product_a >> np.uint64(32)).astype(np.uint32) ^ c3 ^ k1,
            product_a.astype(np.uint32),
        )
        if round_ < 9:
            k0, k1 = np.uint32((int(k0) + int(_KEY_A)) & 0xFFFFFFFF), np.uint32((int(k1) + int(_KEY_B)) & 0xFFFFFFFF)
    return [c0, c1, c2, c3]


def _fma32(a: np.ndarray, b: np.float32, c: np.float32) -> np.ndarray:
    """float32 a * b + c rounded once (the float64 product of two float32 values is exact)."""
    return (a.astype(np.float64) * np.float64(b) + np.float64(c)).astype(np.float32)


def cuda_randn_calls(seed: int, first_call: int, calls: int, shape: tuple[int, ...]) -> np.ndarray:
    """float32 ``(calls, *shape)``: calls ``first_call`` .. of ``torch.randn(shape)`` on a CUDA generator seeded
    with ``seed``."""
    elements = int(np.prod(shape))
    call = np.repeat(np.arange(first_call, first_call + calls, dtype=np.uint64), elements)
    element = np.tile(np.arange(elements, dtype=np.uint64), calls)
    words = philox4x32_10(
        [call.astype(np.uint32), (call >> np.uint64(32)).astype(np.uint32), element.astype(np.uint32), 0 * element],
        (seed & 0xFFFFFFFF, seed >> 32),
    )
    u = _fma32(words[0].astype(np.float32), _INV, _INV / np.float32(2))
    v = _fma32(words[1].astype(np.float32), _INV_2PI, _INV_2PI / np.float32(2))
    radius = np.sqrt(np.float32(-2) * np.log(u))
    return (np.sin(v) * radius).astype(np.float32).reshape(calls, *shape)
