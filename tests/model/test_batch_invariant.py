"""Batch-invariant numerics at the op level: within ``batch_invariant()`` a row's result is bit for bit the same
whatever else its batch holds, at any position and batch size. The shapes are ones where the plain op is not
(on an AVX-512 CPU a GEMM row changes with the row count, a convolution's sample with the batch size, and
``silu`` of a 16-wide row with the parity of the row count)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from tests.bounds import assert_within, silu_reference, sum_of_products_reference
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from voxwire.kernels import batch_invariant as bi


def batches_around(row: torch.Tensor, generator: torch.Generator) -> Iterator[tuple[torch.Tensor, int]]:
    """Batches of random rows holding ``row`` at some position: sizes around and across tile boundaries."""
    for size in (1, 2, 3, bi.TILE - 1, bi.TILE, bi.TILE + 1, 3 * bi.TILE + 5, 100):
        for position in sorted({0, size // 2, size - 1}):
            batch = torch.randn(size, *row.shape, generator=generator)
            batch[position] = row
            yield batch, position


@pytest.mark.isa
def test_tiled_linear_rows_do_not_depend_on_the_batch(threads: int) -> None:
    generator = torch.Generator().manual_seed(threads)
    for features_in, features_out, bias in ((256, 2048, True), (1024, 3072, False), (64, 192, True)):
        weight = torch.randn(features_out, features_in, generator=generator)
        offset = torch.randn(features_out, generator=generator) if bias else None
        row = torch.randn(features_in, generator=generator)
        alone = bi.linear(row[None], weight, offset)[0]
        # Still a linear: within float32's rounding-error bound of the exact result (tests/bounds.py).
        exact, bound = sum_of_products_reference(F.linear, row[None], weight, *([] if offset is None else [offset]))
        assert_within(alone, exact[0], bound[0])
        for batch, position in batches_around(row, generator):
            assert torch.equal(bi.linear(batch, weight, offset)[position], alone), (features_in, len(batch), position)
        # Any leading shape: a (B, T, H) input is its B*T rows.
        tokens = torch.randn(5, 7, features_in, generator=generator)
        tokens[3, 2] = row
        assert torch.equal(bi.linear(tokens, weight, offset)[3, 2], alone)


Reference = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
"""A batch's exact (float64) result under an op and the bound on a float32 computation's error (tests/bounds.py)."""


def _linear() -> tuple[Callable[[torch.Tensor], torch.Tensor], Reference]:
    layer = nn.Linear(256, 2048)
    return layer, lambda x: sum_of_products_reference(F.linear, x, layer.weight, layer.bias)


def _matmul() -> tuple[Callable[[torch.Tensor], torch.Tensor], Reference]:
    weight = torch.randn(1024, 512)
    return lambda x: x @ weight, lambda x: sum_of_products_reference(torch.matmul, x, weight)


def _conv() -> tuple[Callable[[torch.Tensor], torch.Tensor], Reference]:
    conv = nn.Conv1d(512, 256, 7, dilation=3)
    return conv, lambda x: sum_of_products_reference(partial(F.conv1d, dilation=3), x, conv.weight, conv.bias)


def _silu() -> tuple[Callable[[torch.Tensor], torch.Tensor], Reference]:
    return F.silu, silu_reference


class _KernelInputs(TorchDispatchMode):
    """The leading size of every tensor the CPU's GEMM, convolution and silu kernels return: what they were
    handed."""

    KERNELS = frozenset(
        {"aten.linear", "aten.addmm", "aten.mm", "aten.matmul", "aten.conv1d", "aten.convolution", "aten.silu"}
    )

    def __init__(self) -> None:
        super().__init__()
        self.leading_sizes: set[int] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if str(func.overloadpacket) in self.KERNELS:
            self.leading_sizes.add(out.size(0))
        return out


@pytest.mark.isa
@pytest.mark.parametrize(
    ("make", "row_shape", "tile"),
    [
        (_linear, (256,), bi.TILE),
        (_matmul, (3, 1024), bi.TILE),
        (_conv, (512, 22), bi.CONV_TILE),
        (_silu, (16,), bi.VECTOR_PAD),
    ],
    ids=["nn.Linear", "matmul", "nn.Conv1d", "silu"],
)
@torch.inference_mode()
def test_the_mode_routes_the_batch_dependent_ops(
    make: Callable[[], tuple[Callable[[torch.Tensor], torch.Tensor], Reference]],
    row_shape: tuple[int, ...],
    tile: int,
    threads: int,
) -> None:
    torch.manual_seed(threads)
    op, reference = make()
    generator = torch.Generator().manual_seed(2)
    row = 3 * torch.randn(row_shape, generator=generator)
    with bi.batch_invariant():
        with _KernelInputs() as kernels:
            alone = op(row[None])[0]
        for batch, position in batches_around(row, generator):
            assert torch.equal(op(batch)[position], alone), (len(batch), position)
    # Routed whether or not this CPU's plain op depends on the batch (held to AVX2, silu does not): the kernel was
    # handed a whole tile, not the one row.
    assert kernels.leading_sizes == {tile}
    # And still the op: within float32's rounding-error bound of the exact result. Not within some multiple of the
    # plain op's error, which is how accurate this CPU's 1-row GEMM happens to be (on an Intel AVX-512 CPU the plain
    # nn.Linear came out 4x more accurate than the 48-row one, both far inside the bound).
    exact, bound = reference(row[None])
    assert_within(alone, exact[0], bound[0])


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
