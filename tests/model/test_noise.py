"""The seed contract survives drawing a request's whole noise stream at once."""

from __future__ import annotations

import pytest
import torch

from voxwire.sampling import NoiseStream


@pytest.mark.isa
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("feat_dim", "patch_size"), [(64, 2), (64, 4), (3, 5)])
def test_one_draw_of_the_whole_stream_equals_step_by_step_draws(dtype, feat_dim, patch_size) -> None:
    device = torch.device("cpu")
    steps = NoiseStream(1234, feat_dim, patch_size, dtype, device)
    expected = torch.cat([steps.next() for _ in range(37)])
    whole = NoiseStream(1234, feat_dim, patch_size, dtype, device).take(37)
    assert whole.shape == (37, feat_dim, patch_size)
    assert torch.equal(whole, expected)
