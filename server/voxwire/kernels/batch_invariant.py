"""Batch-invariant numerics (``ModelRunner(batch_invariant=True)``, ``voxwire serve --batch-invariant``): each
row of a batch gets bit for bit the result it gets in any other batch, alone included. Off by default: it costs
speed (docs/performance.md).

Why rows are not invariant otherwise: a GEMM's kernel, blocking and accumulation order depend on its row count,
so row r of ``x @ W`` changes in the last bits with the batch (1e-7 in float32 on CPU), as does a convolution's
with the batch size, and a vectorized elementwise op computes the elements of a tensor's scalar tail (its
``numel`` modulo the vector width) with another formula (``silu``: 1 ulp). Once in a while such a difference
lands on an FSQ rounding boundary and the session's audio changes from there on.

Within ``batch_invariant()`` those ops are computed so that their shapes never depend on the batch:

* ``linear`` (``F.linear``, every ``nn.Linear``) and ``matmul`` with a 2-D right operand run over tiles of exactly
  ``TILE`` rows, ``conv1d`` over tiles of ``CONV_TILE`` batch elements, the last tile padded with zeros; a row's
  result does not depend on which tile or position it lands in (checked bit for bit by the tests, 1 and 2
  threads). docs/performance.md says how the tile sizes were chosen;
* ``silu`` runs on the flattened tensor padded to a multiple of ``VECTOR_PAD`` elements, so no element is in a
  scalar tail;
* a sum of each row to one value (``torch.sum`` over every dim but 0: CFG-Zero*'s projections) runs over tiles of
  ``TILE`` rows: torch's CUDA reduction chooses its lanes per output by the number of outputs (ATen's
  ``ReduceConfig`` stacks up to 16 outputs in a block), so with one output per row, a row alone may be summed in
  another order than among 16 rows or more.

The other ops the model runs are invariant as they are: row-wise reductions (RMSNorm, softmax), the
transcendental functions other than ``silu``, CPU ``scaled_dot_product_attention`` over a fixed sequence
length and the CUDA small-sequence attention kernel (one program per row and kv head). What else depends on the
batch is handled where it happens: paged decode attention reads a table as wide as the batch's longest row (the
mode uses ``paged_attention.paged_decode_chunked``), a right-padded prefill batch changes every shape (the runner
prefills one prompt at a time), and the LoRA personas' per-row matmuls (``PersonaLinear``) use ``linear``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

TILE = 48
"""Rows per GEMM in the mode: a multiple of 6, 8 and 16, so no row falls in a GEMM micro-kernel's partial block
(MKL's AVX2 float32 kernel takes rows 6 at a time and computes a partial block of 2 rows differently)."""
CONV_TILE = 4
"""Batch elements per convolution in the mode."""
VECTOR_PAD = 64
"""A multiple of every CPU vector loop's width in elements (2 x 32 bf16 lanes of AVX-512)."""


def _tiled(x: torch.Tensor, op: Callable[[torch.Tensor], torch.Tensor], tile: int) -> torch.Tensor:
    """``op`` applied to x's rows (dim 0) ``tile`` at a time, the last tile padded with zero rows."""
    rows = x.size(0)
    if not rows:
        return op(x)
    padded = -rows % tile
    if padded:
        x = torch.cat([x, x.new_zeros(padded, *x.shape[1:])])
    return torch.cat([op(x[start : start + tile]) for start in range(0, rows + padded, tile)])[:rows]


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear`` whose every row is computed by a GEMM of ``TILE`` rows, whatever x's leading shape."""
    flat = x.reshape(-1, x.size(-1))
    out = _tiled(flat, lambda tile: F.linear(tile, weight, bias), TILE)
    return out.view(*x.shape[:-1], weight.size(0))


def _matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if a.dim() < 2 or b.dim() != 2:  # a batched right operand already runs one GEMM per batch element
        return torch.matmul(a, b)
    flat = a.reshape(-1, a.size(-1))
    return _tiled(flat, lambda tile: torch.mm(tile, b), TILE).view(*a.shape[:-1], b.size(1))


def _conv1d(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    if x.dim() != 3:
        return F.conv1d(x, *args, **kwargs)
    return _tiled(x, lambda tile: F.conv1d(tile, *args, **kwargs), CONV_TILE)


def _sum(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    dim = args[0] if args else kwargs.get("dim")
    dims = [dim] if isinstance(dim, int) else list(dim or ())
    if x.dim() < 2 or sorted(d % x.dim() for d in dims) != list(range(1, x.dim())):
        return torch.sum(x, *args, **kwargs)  # a whole-tensor sum, or one that keeps more than a value per row
    return _tiled(x, lambda tile: torch.sum(tile, *args, **kwargs), TILE)


def _silu(x: torch.Tensor, inplace: bool = False) -> torch.Tensor:
    flat = x.reshape(-1)
    padded = -flat.numel() % VECTOR_PAD
    out = F.silu(F.pad(flat, (0, padded)) if padded else flat)
    result = out[: flat.numel()].view_as(x)
    return x.copy_(result) if inplace else result


_ROUTES: dict[Callable[..., Any], Callable[..., Any]] = {
    F.linear: linear,
    torch.matmul: _matmul,
    torch.Tensor.matmul: _matmul,  # what ``a @ b`` arrives as
    F.conv1d: _conv1d,
    F.silu: _silu,
    torch.sum: _sum,
    torch.Tensor.sum: _sum,
}


class _BatchInvariantMode(TorchFunctionMode):
    """Sends the batch-dependent ops to their invariant versions (which run with the mode off)."""

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        return _ROUTES.get(func, func)(*args, **(kwargs or {}))


# Per thread, as torch's function modes are: the engine thread's step must not switch another thread's ops.
_state = threading.local()


def active() -> bool:
    """Whether the calling code runs within ``batch_invariant()`` on this thread."""
    return getattr(_state, "active", False)


@contextmanager
def batch_invariant(enabled: bool = True) -> Iterator[None]:
    """Within the block (when ``enabled``), torch ops on this thread compute every row independently of the batch."""
    if not enabled:
        yield
        return
    previous, _state.active = active(), True
    try:
        with _BatchInvariantMode():
            yield
    finally:
        _state.active = previous
