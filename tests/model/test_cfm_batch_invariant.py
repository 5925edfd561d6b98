"""CFG-Zero*'s two row sums (``UnifiedCFM._guided_velocity``) under batch-invariant numerics (issue 34, D3): a
row's sample is bit for bit the same alone and among 16 rows or more, also where the sum kernel orders a row's
sum by the number of rows, as torch's CUDA reduction may."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from voxwire.kernels import batch_invariant as bi
from voxwire.model.cfm import CfmSchedule, UnifiedCFM
from voxwire.model.local_dit import VoxCPMLocDiT
from voxwire.model_config import ModelConfig
from voxwire.tiny.configs import TINY_CONFIGS

CONFIG = ModelConfig.from_dict(TINY_CONFIGS["voxcpm2"])


class RowCountOrderedSums(TorchDispatchMode):
    """A stand-in for a reduction kernel whose order depends on its number of outputs (torch's CUDA one lays out
    its lanes by it, ATen's ``ReduceConfig``): a (rows, n) matrix summed to one value per row is summed left to
    right when it has fewer than 16 rows, pairwise from 16 rows on. Records the shape of every sum's input. The
    CPU's own kernel sums a row in the same order at any row count, so without it the tests could not fail."""

    def __init__(self) -> None:
        super().__init__()
        self.inputs: list[tuple[int, ...]] = []

    @property
    def rows_seen(self) -> set[int]:
        """The row counts of the (rows, n) matrices summed to one value per row."""
        return {shape[0] for shape in self.inputs if len(shape) == 2}

    def __torch_dispatch__(
        self, func: Callable[..., Any], types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        if func.overloadpacket is torch.ops.aten.sum:
            self.inputs.append(tuple(args[0].shape))
        if func is not torch.ops.aten.sum.dim_IntList or args[0].dim() != 2 or list(args[1]) not in ([1], [-1]):
            return func(*args, **kwargs)
        x = args[0]
        keepdim = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
        columns = list(x.float().unbind(1))
        if x.size(0) < 16:
            total = columns[0]
            for column in columns[1:]:
                total = total + column
        else:
            while len(columns) > 1:
                pairs = [columns[i] + columns[i + 1] for i in range(0, len(columns) - 1, 2)]
                columns = pairs + columns[len(columns) - len(columns) % 2 :]
            total = columns[0]
        total = total.to(x.dtype)
        return total[:, None] if keepdim else total


STEPS = 4
"""CFM timesteps per sample: three estimator passes after CFG-Zero*'s skipped first step."""
CPU = torch.device("cpu")


def sampler() -> UnifiedCFM:
    """The tiny VoxCPM2's CFM sampler, random weights."""
    torch.manual_seed(0)
    estimator = VoxCPMLocDiT(CONFIG.local_dit, CONFIG.feat_dim, CONFIG.patch_size, mu_tokens=1)
    return UnifiedCFM(estimator, mean_mode=CONFIG.mean_mode).eval()


def sample(cfm: UnifiedCFM, rows: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(the samples of ``rows`` random rows together, the first row's alone)."""
    generator = torch.Generator().manual_seed(seed)
    noise = torch.randn(rows, CONFIG.feat_dim, CONFIG.patch_size, generator=generator)
    mu = torch.randn(rows, CONFIG.local_dit.hidden_size, generator=generator)
    cond = torch.randn(rows, CONFIG.feat_dim, CONFIG.patch_size, generator=generator)
    cfg = 1.0 + torch.rand(rows, generator=generator)
    together = cfm(noise, mu, cond, cfg, CfmSchedule.build([STEPS] * rows, torch.float32, CPU))
    alone = cfm(noise[:1], mu[:1], cond[:1], cfg[:1], CfmSchedule.build([STEPS], torch.float32, CPU))
    return together[0], alone[0]


@pytest.mark.isa
@torch.inference_mode()
def test_a_rows_sample_is_the_same_alone_and_among_16_rows() -> None:
    with bi.batch_invariant(), RowCountOrderedSums() as sums:
        together, alone = sample(sampler(), rows=16, seed=2)
    assert torch.equal(together, alone)
    assert sums.rows_seen == {bi.TILE}  # every projection was summed over a whole tile


@pytest.mark.isa
@torch.inference_mode()
def test_without_the_mode_the_stand_in_changes_the_lone_rows_sample() -> None:
    """What the mode prevents: CFG-Zero*'s sums taken over the batch as it is."""
    with RowCountOrderedSums() as sums:
        together, alone = sample(sampler(), rows=16, seed=2)
    assert not torch.equal(together, alone)
    assert sums.rows_seen == {1, 16}


@pytest.mark.isa
def test_only_sums_to_one_value_per_row_are_tiled() -> None:
    x = torch.randn(5, 3, 7)
    with bi.batch_invariant(), RowCountOrderedSums() as sums:
        per_row = torch.sum(x, dim=(1, 2), keepdim=True)
        per_head = x.sum(-1)
        whole = torch.sum(x)
    assert torch.equal(per_row, torch.sum(x, dim=(1, 2), keepdim=True)) and per_row.shape == (5, 1, 1)
    assert torch.equal(per_head, x.sum(-1)) and torch.equal(whole, torch.sum(x))
    assert sums.inputs == [(bi.TILE, 3, 7), (5, 3, 7), (5, 3, 7)]
