"""A bidirectional stack asked for its last positions only (``MiniCPMModel.forward(outputs=n)``, what LocDiT
does each timestep) returns the whole computation's hidden states at those positions."""

from __future__ import annotations

import pytest
import torch

from voxstream.config import ModelConfig
from voxstream.model.minicpm import MiniCPMModel
from voxstream.tiny.configs import ALL_CONFIGS


def make_stack(dtype: torch.dtype) -> MiniCPMModel:
    config = ModelConfig.from_dict(ALL_CONFIGS["voxcpm2"], source="voxcpm2").lm_config
    torch.manual_seed(0)
    stack = MiniCPMModel(config, rope_positions=16).to(dtype).eval()
    stack.rope_emb.init_nonpersistent_buffers()
    return stack


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@torch.inference_mode()
def test_last_positions_equal_the_whole_computation_sliced(dtype: torch.dtype, fused: bool) -> None:
    stack = make_stack(dtype)
    if fused:
        stack.fuse_projections()
    x = torch.randn(3, 11, stack.config.hidden_size, generator=torch.Generator().manual_seed(1)).to(dtype)
    whole, whole_kvs = stack(x, is_causal=False)
    last, kvs = stack(x, is_causal=False, outputs=4)
    assert last.shape == (3, 4, stack.config.hidden_size)
    assert torch.equal(last, whole[:, -4:])
    # Keys and values still cover every position (a cache filled from them is whole).
    assert all(torch.equal(k, wk) and torch.equal(v, wv) for (k, v), (wk, wv) in zip(kvs, whole_kvs, strict=True))


def test_last_positions_of_causal_attention_are_refused() -> None:
    stack = make_stack(torch.float32)
    with pytest.raises(ValueError, match="bidirectional"):
        stack(torch.zeros(1, 5, stack.config.hidden_size), is_causal=True, outputs=2)
