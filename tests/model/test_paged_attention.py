"""Paged decode attention: equal to plain attention over each row's own positions, whatever lies past them."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from tests.bounds import assert_within, paged_attention_reference

import voxwire
from voxwire.engine import Engine, EngineConfig, Request, RunnerOptions, SynthesisParams
from voxwire.engine.runner import ModelRunner
from voxwire.kernels.batch_invariant import batch_invariant
from voxwire.model.paged_attention import (
    PagedDecode,
    attention_path,
    decode_attention,
    paged_decode_chunked,
    paged_decode_torch,
)
from voxwire.tiny.checkpoint import make_tiny_checkpoint


@pytest.mark.isa
@pytest.mark.parametrize("attention", [paged_decode_torch, paged_decode_chunked], ids=["torch", "chunked"])
@pytest.mark.parametrize(("q_heads", "kv_heads"), [(4, 4), (4, 2), (8, 1), (16, 2)])
@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_paged_attention_is_within_float32_error_of_the_exact_result(
    q_heads: int, kv_heads: int, block_size: int, attention: PagedDecode
) -> None:
    generator = torch.Generator().manual_seed(q_heads * 100 + kv_heads * 10 + block_size)
    dim, num_blocks, width = 32, 64, 12
    # Mixed lengths: one position, exactly one block, one past a boundary, a full table, and a tail.
    lengths = [1, block_size, block_size + 1, width * block_size, 2 * block_size - 1, 3]
    lengths = [min(length, width * block_size) for length in lengths]
    k_cache = torch.randn(num_blocks, block_size, kv_heads, dim, generator=generator)
    v_cache = torch.randn(num_blocks, block_size, kv_heads, dim, generator=generator)
    order = torch.randperm(num_blocks - 1, generator=generator) + 1
    tables = torch.zeros(len(lengths), width, dtype=torch.int32)  # empty tails point at the null block 0
    used = 0
    for row, length in enumerate(lengths):
        count = math.ceil(length / block_size)
        tables[row, :count] = order[used : used + count]
        used += count
        # Stale values past the row's length in its own last block, and garbage in the null block.
        blocks, offset = tables[row, count - 1], length % block_size
        if offset:
            k_cache[blocks, offset:] = float("nan")
            v_cache[blocks, offset:] = float("nan")
    k_cache[0], v_cache[0] = float("nan"), float("inf")
    q = torch.randn(len(lengths), q_heads, dim, generator=generator)
    seq_lens = torch.tensor(lengths, dtype=torch.int32)
    scale = 1 / math.sqrt(dim)
    got = attention(q, k_cache, v_cache, tables, seq_lens, scale)
    # Row by row in float64 over the row's own positions, and float32's rounding-error bound (tests/bounds.py).
    assert_within(got, *paged_attention_reference(q, k_cache, v_cache, tables, seq_lens, scale))
    # A table sliced to the blocks the longest row reached (what the CPU runner passes) gives the same bits: each row
    # is attended over a width of its own (torch) or in chunks from position 0 (chunked), whatever the table's width.
    live = math.ceil(max(lengths) / block_size)
    assert torch.equal(attention(q, k_cache, v_cache, tables[:, :live], seq_lens, scale), got)


@pytest.mark.isa
@pytest.mark.parametrize("attention", [paged_decode_torch, paged_decode_chunked], ids=["torch", "chunked"])
def test_a_row_with_no_positions_attends_to_zeros(attention: PagedDecode) -> None:
    # A batch bucket's padding rows have seq_len 0; their output must be finite (zeros, as the Triton kernel's).
    generator = torch.Generator().manual_seed(5)
    q = torch.randn(2, 4, 8, generator=generator)
    k_cache, v_cache = torch.randn(4, 4, 2, 8, generator=generator), torch.randn(4, 4, 2, 8, generator=generator)
    tables = torch.tensor([[1, 2], [3, 0]], dtype=torch.int32)
    got = attention(q, k_cache, v_cache, tables, torch.tensor([0, 5], dtype=torch.int32), 0.3)
    assert torch.equal(got[0], torch.zeros_like(got[0]))
    assert torch.isfinite(got[1]).all()


@pytest.mark.isa
def test_a_rows_attention_is_bitwise_the_same_in_any_batch() -> None:
    """FSQ after the base LM turns a 1e-7 difference into a different patch now and then, so a session's
    attention must not depend at all on the other rows of its batch or on how far they reach: every row, short
    or long, on any instruction set (CI runs tests/model again with ATen, MKL and oneDNN held to AVX2)."""
    generator = torch.Generator().manual_seed(3)
    block_size, dim = 16, 64
    k_cache = torch.randn(200, block_size, 2, dim, generator=generator)
    v_cache = torch.randn(200, block_size, 2, dim, generator=generator)
    lengths = [21, 300, 5, 150, 77, 999, 16, 64] * 6
    tables = torch.zeros(len(lengths), 64, dtype=torch.int32)
    for row, length in enumerate(lengths):
        count = math.ceil(length / block_size)
        tables[row, :count] = torch.randint(1, 200, (count,), generator=generator, dtype=torch.int32)
    q = torch.randn(len(lengths), 8, dim, generator=generator)
    seq_lens = torch.tensor(lengths, dtype=torch.int32)
    together = paged_decode_torch(q, k_cache, v_cache, tables, seq_lens, 0.125)
    for row in range(len(lengths)):
        width = math.ceil(lengths[row] / block_size)
        alone = paged_decode_torch(
            q[row : row + 1], k_cache, v_cache, tables[row : row + 1, :width], seq_lens[row : row + 1], 0.125
        )
        assert torch.equal(alone[0], together[row]), row


@pytest.mark.isa
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_attention_of_a_row_is_bitwise_the_same_in_any_batch(dtype: torch.dtype) -> None:
    """Batch-invariant numerics: whatever the other rows' lengths (so however far the batch's table reaches), a
    row's chunked attention is the same bits as alone. SDPA over one width for the whole batch is not, past a few
    hundred positions (on this CPU 40% of such rows differ in float32)."""
    generator = torch.Generator().manual_seed(5)
    block_size, dim = 16, 64
    k_cache = torch.randn(400, block_size, 2, dim, generator=generator).to(dtype)
    v_cache = torch.randn(400, block_size, 2, dim, generator=generator).to(dtype)
    for batch in (2, 9, 24):
        lengths = torch.randint(1, 1500, (batch,), generator=generator, dtype=torch.int32)
        width = math.ceil(int(lengths.max()) / block_size)
        tables = torch.randint(1, 400, (batch, width), generator=generator, dtype=torch.int32)
        q = torch.randn(batch, 8, dim, generator=generator).to(dtype)
        together = paged_decode_chunked(q, k_cache, v_cache, tables, lengths, 0.125)
        for row in range(batch):
            own = math.ceil(int(lengths[row]) / block_size)
            alone = paged_decode_chunked(
                q[row : row + 1], k_cache, v_cache, tables[row : row + 1, :own], lengths[row : row + 1], 0.125
            )
            assert torch.equal(alone[0], together[row]), (batch, row)


@pytest.mark.isa
def test_batch_invariant_numerics_decode_with_the_chunked_path() -> None:
    q, cache = torch.randn(1, 2, 8), torch.randn(3, 4, 1, 8)
    tables, lens = torch.tensor([[1, 2]], dtype=torch.int32), torch.tensor([5], dtype=torch.int32)
    with batch_invariant():
        got = decode_attention(q, cache, cache, tables, lens, 0.3)
    assert torch.equal(got, paged_decode_chunked(q, cache, cache, tables, lens, 0.3))


@pytest.mark.isa
def test_cpu_decode_uses_the_torch_path() -> None:
    assert attention_path(torch.device("cpu")) == "torch-paged"
    q, cache = torch.randn(1, 2, 8), torch.randn(3, 4, 1, 8)
    tables, lens = torch.tensor([[1, 2]], dtype=torch.int32), torch.tensor([5], dtype=torch.int32)
    assert torch.equal(
        decode_attention(q, cache, cache, tables, lens, 0.3), paged_decode_torch(q, cache, cache, tables, lens, 0.3)
    )


def test_no_sdpa_call_on_the_decode_path_has_both_a_mask_and_enable_gqa(tmp_path, monkeypatch) -> None:
    """On CUDA that combination silently falls back to the MATH backend (fp32 copies, K/V repeated)."""
    tts = voxwire.load_model(make_tiny_checkpoint(tmp_path / "v2", "voxcpm2"), device="cpu")
    engine = Engine(ModelRunner(tts, RunnerOptions(num_slots=2, max_length=128)), EngineConfig(max_running=2))
    for rid, text in (("a", "Short."), ("b", "A rather longer sentence than the first.")):
        engine.add(Request(rid, text, params=SynthesisParams(seed=1, max_len=4)))
    engine.step()  # both prefilled, first patches decoded
    calls: list[tuple[bool, bool]] = []
    original = F.scaled_dot_product_attention

    def recording(*args, **kwargs):
        calls.append((kwargs.get("attn_mask") is not None, bool(kwargs.get("enable_gqa", False))))
        return original(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", recording)
    engine.step()  # decode only: rows of different lengths
    assert any(mask for mask, _ in calls), "the decode step made no masked attention call"
    assert not any(mask and gqa for mask, gqa in calls)
