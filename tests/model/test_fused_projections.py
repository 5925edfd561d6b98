"""q/k/v and gate/up as one GEMM each (``fuse_projections``, done by the loader): no value changes on CPU,
the state dict keeps its keys, and loading new weights afterwards reaches the fused GEMMs."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from voxwire.model.kv_cache import KVCache
from voxwire.model.minicpm import MiniCPMModel
from voxwire.model_config import ModelConfig
from voxwire.params import SynthesisParams
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


@pytest.mark.isa
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fusing_changes_no_value(dtype: torch.dtype) -> None:
    stack = make_stack(dtype)
    before, keys = run(stack), list(stack.state_dict())
    stack.fuse_projections()
    assert torch.equal(run(stack), before)
    assert list(stack.state_dict()) == keys


@pytest.mark.isa
def test_weights_loaded_after_fusing_reach_the_fused_gemm() -> None:
    stack, other = make_stack(torch.float32), make_stack(torch.float32, seed=5)
    stack.fuse_projections()
    stack.load_state_dict(other.state_dict())
    assert torch.equal(run(stack), run(other))


@pytest.mark.isa
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


def fused_layers(stack: MiniCPMModel) -> list[tuple[nn.Module, tuple[nn.Module, ...]]]:
    """Every fused projection group of the stack with the layers it fuses."""
    groups: list[tuple[nn.Module, tuple[nn.Module, ...]]] = []
    for layer in stack.layers:
        attention, mlp = layer.self_attn, layer.mlp
        groups += [
            (attention, (attention.q_proj, attention.k_proj, attention.v_proj)),
            (mlp, (mlp.gate_proj, mlp.up_proj)),
        ]
    return groups


@pytest.mark.isa
def test_casting_keeps_the_fusion_and_frees_the_old_fused_weights() -> None:
    """A model cast after fusing (``LoadedModel.cast``) still runs one GEMM per group, with values equal to a
    model built in the new dtype and fused, and the old fp32 fused tensors are freed, not kept alive beside it."""
    import weakref

    stack = make_stack(torch.float32)
    stack.fuse_projections()
    old = [weakref.ref(module._fused.weight) for module, _ in fused_layers(stack)]
    stack.to(torch.bfloat16)
    built = make_stack(torch.bfloat16)
    built.fuse_projections()
    for module, layers in fused_layers(stack):
        fused = module._fused
        assert fused.weight is not None and fused.weight.dtype == torch.bfloat16
        x = torch.randn(1, layers[0].in_features).to(torch.bfloat16)
        assert fused(x, *layers) is not None, "the fused GEMM is off after the cast"
        assert all(
            layer.weight.untyped_storage().data_ptr() == fused.weight.untyped_storage().data_ptr() for layer in layers
        )
    assert all(ref() is None for ref in old), "stale fp32 fused weights are still alive"
    assert torch.equal(run(stack), run(built))


def test_a_cast_after_a_projection_was_replaced_drops_the_stale_fused_weight() -> None:
    stack = make_stack(torch.float32)
    stack.fuse_projections()
    attention = stack.layers[0].self_attn
    attention.q_proj = nn.Linear(attention.q_proj.in_features, attention.q_proj.out_features, bias=False)
    stack.to(torch.bfloat16)
    assert attention._fused.weight is None
    assert (
        attention._fused(
            torch.zeros(1, attention.q_proj.in_features, dtype=torch.bfloat16),
            attention.q_proj,
            attention.k_proj,
            attention.v_proj,
        )
        is None
    )


@pytest.mark.isa
def test_loaded_model_cast_keeps_fused_projections(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``LoadedModel.cast`` (gpu_check's fp32 -> bf16 switch) leaves every transformer fused, and a cast model
    generates what a model loaded in that dtype generates."""
    import voxwire
    from voxwire.tiny.checkpoint import make_tiny_checkpoint

    checkpoint = make_tiny_checkpoint(tmp_path / "v2", "voxcpm2")
    cast = voxwire.load_model(checkpoint, device="cpu", dtype="float32")
    cast.cast(torch.bfloat16)
    loaded = voxwire.load_model(checkpoint, device="cpu", dtype="bfloat16")
    model = cast.model
    for stack in (model.base_lm, model.residual_lm, model.feat_encoder.encoder, model.feat_decoder.estimator.decoder):
        for module, layers in fused_layers(stack):
            x = torch.zeros(1, layers[0].in_features, dtype=torch.bfloat16)
            assert module._fused(x, *layers) is not None
    assert torch.equal(
        torch.as_tensor(cast.generate("hello there", SynthesisParams(seed=3, max_len=6))),
        torch.as_tensor(loaded.generate("hello there", SynthesisParams(seed=3, max_len=6))),
    )
