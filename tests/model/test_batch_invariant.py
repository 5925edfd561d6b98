"""Batch-invariant numerics at the op level: within ``batch_invariant()`` a row's result is bit for bit the same
whatever else its batch holds, at any position and batch size. The shapes are ones where the plain op is not
(on an AVX-512 CPU a GEMM row changes with the row count, a convolution's sample with the batch size, and
``silu`` of a 16-wide row with the parity of the row count)."""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Iterator

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from voxwire.kernels import batch_invariant as bi


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def threads(request: pytest.FixtureRequest) -> Iterator[int]:
    previous = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(previous)


def batches_around(row: torch.Tensor, generator: torch.Generator) -> Iterator[tuple[torch.Tensor, int]]:
    """Batches of random rows holding ``row`` at some position: sizes around and across tile boundaries."""
    for size in (1, 2, 3, bi.TILE - 1, bi.TILE, bi.TILE + 1, 3 * bi.TILE + 5, 100):
        for position in sorted({0, size // 2, size - 1}):
            batch = torch.randn(size, *row.shape, generator=generator)
            batch[position] = row
            yield batch, position


def test_tiled_linear_rows_do_not_depend_on_the_batch(threads: int) -> None:
    generator = torch.Generator().manual_seed(threads)
    for features_in, features_out, bias in ((256, 2048, True), (1024, 3072, False), (64, 192, True)):
        weight = torch.randn(features_out, features_in, generator=generator)
        offset = torch.randn(features_out, generator=generator) if bias else None
        row = torch.randn(features_in, generator=generator)
        alone = bi.linear(row[None], weight, offset)[0]
        torch.testing.assert_close(alone, F.linear(row, weight, offset), atol=1e-4, rtol=1e-5)  # still a linear
        for batch, position in batches_around(row, generator):
            assert torch.equal(bi.linear(batch, weight, offset)[position], alone), (features_in, len(batch), position)
        # Any leading shape: a (B, T, H) input is its B*T rows.
        tokens = torch.randn(5, 7, features_in, generator=generator)
        tokens[3, 2] = row
        assert torch.equal(bi.linear(tokens, weight, offset)[3, 2], alone)


def _linear() -> Callable[[torch.Tensor], torch.Tensor]:
    return nn.Linear(256, 2048)


class _MatMul(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(1024, 512))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight


def _matmul() -> Callable[[torch.Tensor], torch.Tensor]:
    return _MatMul()


def _conv() -> Callable[[torch.Tensor], torch.Tensor]:
    return nn.Conv1d(512, 256, 7, dilation=3)


def _silu() -> Callable[[torch.Tensor], torch.Tensor]:
    return F.silu


@pytest.mark.parametrize(
    ("make", "row_shape"),
    [(_linear, (256,)), (_matmul, (3, 1024)), (_conv, (512, 22)), (_silu, (16,))],
    ids=["nn.Linear", "matmul", "nn.Conv1d", "silu"],
)
@torch.inference_mode()
def test_the_mode_routes_the_batch_dependent_ops(
    make: Callable[[], Callable[[torch.Tensor], torch.Tensor]], row_shape: tuple[int, ...], threads: int
) -> None:
    torch.manual_seed(threads)
    op = make()
    generator = torch.Generator().manual_seed(2)
    row = 3 * torch.randn(row_shape, generator=generator)
    with bi.batch_invariant():
        alone = op(row[None])[0]
        for batch, position in batches_around(row, generator):
            assert torch.equal(op(batch)[position], alone), (len(batch), position)
    # The same op with other roundings: as close to the exact (float64) result as the plain op is. A fixed
    # tolerance between the two float32 results would sit below the op's own rounding error (3e-4 on the
    # 1024-long products here, with or without the mode) and pass or fail with the CPU's GEMM blocking.
    exact = (copy.deepcopy(op).double() if isinstance(op, nn.Module) else op)(row[None].double())[0]
    plain = op(row[None])[0]
    mode_error = (alone.double() - exact).abs().max().item()
    plain_error = (plain.double() - exact).abs().max().item()
    assert mode_error <= 2 * plain_error + 1e-6, (mode_error, plain_error)


def test_the_mode_is_scoped_and_off_by_default() -> None:
    assert not bi.active()
    with pytest.raises(RuntimeError), bi.batch_invariant():
        assert bi.active()
        raise RuntimeError
    assert not bi.active()
    with bi.batch_invariant(enabled=False):
        assert not bi.active()


def test_the_mode_holds_only_on_the_thread_that_entered_it() -> None:
    seen: list[bool] = []
    with bi.batch_invariant():
        other = threading.Thread(target=lambda: seen.append(bi.active()))
        other.start()
        other.join()
        assert bi.active()
    assert seen == [False]
