"""q/k/v and gate/up as one GEMM each (``fuse_projections``, done by the loader): no value changes on CPU,
the state dict keeps its keys, and loading new weights afterwards reaches the fused GEMMs."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from voxwire.config import ModelConfig
from voxwire.model.kv_cache import KVCache
from voxwire.model.minicpm import MiniCPMModel
from voxwire.tiny.configs import ALL_CONFIGS


def make_stack(dtype: torch.dtype, seed: int = 0) -> MiniCPMModel:
    config = ModelConfig.from_dict(ALL_CONFIGS["voxcpm2"], source="voxcpm2").lm_config
    torch.manual_seed(seed)
    stack = MiniCPMModel(config, rope_positions=64).to(dtype).eval()
    stack.rope_emb.init_nonpersistent_buffers()
    return stack


@torch.inference_mode()
def run(stack: MiniCPMModel) -> torch.Tensor:
    """A prefill of 9 positions, then one decode step per row: every output concatenated."""
    generator = torch.Generator().manual_seed(1)
    dtype, hidden = stack.norm.weight.dtype, stack.config.hidden_size
    prefill, kvs = stack(torch.randn(2, 9, hidden, generator=generator).to(dtype), is_causal=True)
    cache = KVCache.dedicated(stack.config, 2, 32, torch.device("cpu"), dtype)
    cache.fill(kvs)
    step = stack.forward_step(torch.randn(2, hidden, generator=generator).to(dtype), torch.tensor([9, 9]), cache)
    return torch.cat([prefill.flatten(), step.flatten()])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fusing_changes_no_value(dtype: torch.dtype) -> None:
    stack = make_stack(dtype)
    before, keys = run(stack), list(stack.state_dict())
    stack.fuse_projections()
    assert torch.equal(run(stack), before)
    assert list(stack.state_dict()) == keys


def test_weights_loaded_after_fusing_reach_the_fused_gemm() -> None:
    stack, other = make_stack(torch.float32), make_stack(torch.float32, seed=5)
    stack.fuse_projections()
    stack.load_state_dict(other.state_dict())
    assert torch.equal(run(stack), run(other))


def test_a_replaced_projection_is_used_instead_of_the_fused_weights() -> None:
    """A projection swapped after fusing (an adapter wrapping it, say) is what runs."""
    stack = make_stack(torch.float32)
    stack.fuse_projections()
    fused = run(stack)
    attention = stack.layers[0].self_attn
    replacement = nn.Linear(attention.q_proj.in_features, attention.q_proj.out_features, bias=False)
    with torch.no_grad():
        replacement.weight.copy_(attention.q_proj.weight * 2)
    attention.q_proj = replacement
    assert not torch.equal(run(stack), fused)
    with torch.no_grad():
        replacement.weight.mul_(0.5)
    assert torch.equal(run(stack), fused)
