"""The paged decode attention Triton kernel (interpreted on CPU, see conftest): in fp32 within float32's
rounding-error bound of the exact (float64) result, as the torch path the model runs off CUDA is
(tests/model/test_paged_attention.py); with half-precision caches, against that torch path."""

from __future__ import annotations

import pytest
import torch
from tests.bounds import assert_within, paged_attention_reference

from voxwire.kernels.paged_decode import paged_decode_attention
from voxwire.model.paged_attention import paged_decode_torch

HEAD_DIM = 16
KV_HEADS = 2


def make_case(
    lengths: list[int], group: int, block_size: int, dtype: torch.dtype, seed: int = 0, spare_blocks: int = 2
) -> tuple[torch.Tensor, ...]:
    """A shuffled block pool holding each row's blocks, plus ``spare_blocks`` unused table entries per row
    (an empty tail). Everything a row must not read is NaN: unused blocks and the positions of a
    row's last block at or past its length."""
    generator = torch.Generator().manual_seed(seed)
    q_heads = KV_HEADS * group
    batch = len(lengths)
    needed = [(length + block_size - 1) // block_size for length in lengths]
    max_blocks = max(needed) + spare_blocks
    num_blocks = sum(needed) + 3
    k_cache = torch.full((num_blocks, block_size, KV_HEADS, HEAD_DIM), float("nan"))
    v_cache = torch.full_like(k_cache, float("nan"))
    order = torch.randperm(num_blocks, generator=generator).tolist()
    tables = torch.zeros(batch, max_blocks, dtype=torch.int32)
    for row, length in enumerate(lengths):
        # Unused entries point at a real (NaN) block, as a stale table would.
        tables[row] = order[-1]
        for index in range(needed[row]):
            block = order.pop(0)
            tables[row, index] = block
            live = min(block_size, length - index * block_size)
            k_cache[block, :live] = torch.randn(live, KV_HEADS, HEAD_DIM, generator=generator)
            v_cache[block, :live] = torch.randn(live, KV_HEADS, HEAD_DIM, generator=generator)
    q = torch.randn(batch, q_heads, HEAD_DIM, generator=generator)
    seq_lens = torch.tensor(lengths, dtype=torch.int32)
    return q.to(dtype), k_cache.to(dtype), v_cache.to(dtype), tables, seq_lens


def oracle(q, k_cache, v_cache, tables, seq_lens, scale) -> torch.Tensor:
    """``paged_decode_torch`` in fp32 (the kernel accumulates in fp32 whatever the cache dtype), rounded to q's
    dtype."""
    args = (q.float(), k_cache.float(), v_cache.float(), tables, seq_lens, scale)
    return paged_decode_torch(*args).to(q.dtype)


def run_kernel(case: tuple[torch.Tensor, ...], scale: float, device: torch.device) -> torch.Tensor:
    """The kernel on ``device`` (see conftest), its output brought back to the CPU."""
    return paged_decode_attention(*(t.to(device) for t in case), scale).cpu()


MIXED = [0, 1, 15, 16, 17, 32, 33, 47, 64]


@pytest.mark.isa
@pytest.mark.parametrize("group", [1, 2, 4, 8])
@pytest.mark.parametrize("block_size", [16, 32])
def test_kernel_fp32_is_within_float32_error_of_the_exact_result(
    group: int, block_size: int, device: torch.device
) -> None:
    """Mixed lengths: zero, one, both sides of and exactly at block boundaries, with empty table tails. The bound is
    the analysis of any one-pass or online softmax in float32 (tests/bounds.py), not how close this machine's
    kernel happens to come to the torch path."""
    case = make_case(MIXED, group, block_size, torch.float32)
    scale = HEAD_DIM**-0.5
    got = run_kernel(case, scale, device)
    assert not got.isnan().any()
    assert_within(got, *paged_attention_reference(*case, scale))


@pytest.mark.isa
@pytest.mark.parametrize("block_size", [1, 4, 12, 64])
def test_kernel_takes_any_block_size(block_size: int, device: torch.device) -> None:
    """Blocks smaller than a tile (several per tile, not a power of two) and larger (several tiles each)."""
    case = make_case([0, 1, 5, 12, 16, 17, 64, 70], 4, block_size, torch.float32, seed=block_size)
    assert_within(run_kernel(case, 0.25, device), *paged_attention_reference(*case, 0.25))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_kernel_equals_torch_path_half(dtype: torch.dtype, device: torch.device) -> None:
    """Half-precision caches accumulate in fp32: the outputs agree to within the output dtype's rounding."""
    case = make_case(MIXED, 4, 16, dtype, seed=1)
    expected = oracle(*case, 0.3)
    got = run_kernel(case, 0.3, device)
    assert got.dtype == dtype
    resolution = torch.finfo(dtype).eps
    torch.testing.assert_close(got.float(), expected.float(), atol=2 * resolution, rtol=2 * resolution)


@pytest.mark.isa
def test_seq_len_zero_rows_are_zero(device: torch.device) -> None:
    case = make_case([0, 5, 0], 2, 16, torch.float32)
    got = run_kernel(case, 0.25, device)
    assert torch.equal(got[0], torch.zeros_like(got[0])) and torch.equal(got[2], torch.zeros_like(got[2]))
    assert got[1].abs().sum() > 0


@pytest.mark.isa
def test_kernel_reads_rows_independently(device: torch.device) -> None:
    """A row's output does not depend on the rest of the batch, to the bit: one program per (row, kv head) runs the
    same code on the same data whatever the batch."""
    q, k_cache, v_cache, tables, seq_lens = make_case(MIXED, 2, 16, torch.float32, seed=3)
    batch = run_kernel((q, k_cache, v_cache, tables, seq_lens), 0.25, device)
    alone = run_kernel((q[4:5], k_cache, v_cache, tables[4:5], seq_lens[4:5]), 0.25, device)
    assert torch.equal(batch[4:5], alone)


@pytest.mark.parametrize(
    ("shapes", "message"),
    [
        (((2, 4, 16), (8, 16, 3, 16), (2, 4), (2,)), "multiple of"),
        (((2, 4, 16), (8, 16, 2, 32), (2, 4), (2,)), "head_dim"),
        (((2, 4, 16), (8, 16, 2, 16), (3, 4), (2,)), "block_tables"),
        (((2, 4, 12), (8, 16, 2, 12), (2, 4), (2,)), "head_dim must be a power of two"),
    ],
)
def test_bad_shapes_raise(shapes: tuple, message: str) -> None:
    q_shape, cache_shape, table_shape, lens_shape = shapes
    cache = torch.zeros(cache_shape)
    with pytest.raises(ValueError, match=message):
        paged_decode_attention(
            torch.zeros(q_shape),
            cache,
            cache,
            torch.zeros(table_shape, dtype=torch.int32),
            torch.zeros(lens_shape, dtype=torch.int32),
            1.0,
        )
