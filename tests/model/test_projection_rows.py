"""LocDiT's output projection, LocEnc's input projection and the projection of LocEnc's outputs into the LM each run
as one GEMM over all their rows (issue 34): with the weights frozen, as the server holds the model, none dispatches a
batched GEMM against its weight expanded to every batch row (on CUDA the whole weight read once per row).

Their values are those the reference's model computes, bit for bit: its weights require gradients, so ``matmul``
folds the rows into one GEMM there too. In bfloat16 (the served dtype) they also equal the frozen model's batched
GEMMs they replace; in float32 those differ in the last bits where an element has fewer than 4 rows (a decode
step's one CLS output per row into the LM; VoxCPM-0.5B's 2-frame patches): MKL's sgemm runs a GEMM of 1-3 rows with
another kernel, whose sums run in another order (as tests/model/test_audio_vae_conv_transpose.py found for D1)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from voxwire.model.minicpm import linear_rows
from voxwire.model.voxcpm import VoxCPMModel
from voxwire.model_config import ModelConfig
from voxwire.tiny.configs import ALL_CONFIGS


def frozen_model(dtype: torch.dtype, device: str = "cpu") -> VoxCPMModel:
    """The tiny VoxCPM2 as the server holds a model: eval, no gradients."""
    torch.manual_seed(0)
    config = ModelConfig.from_dict(ALL_CONFIGS["voxcpm2"], source="voxcpm2")
    with torch.device(device):
        model = VoxCPMModel(config)
    model.cast_transformers(dtype)
    return model.eval().requires_grad_(False)


def decode_patches(model: VoxCPMModel, rows: int, dtype: torch.dtype, device: str = "cpu") -> torch.Tensor:
    """(rows, 1, P, D) patches laid out as a decode step hands them to LocEnc: the sampler's (rows, D, P) transposed."""
    config = model.config
    sampled = torch.randn(rows, config.feat_dim, config.patch_size, device=device).to(dtype)
    return sampled.transpose(1, 2).unsqueeze(1)


def embed_as_before(model: VoxCPMModel, patches: torch.Tensor) -> torch.Tensor:
    """``embed_patches`` before issue 34 (the reference's code): each projection called on its strided input."""
    encoder = model.feat_encoder
    batch, length, patch, _ = patches.shape
    tokens = encoder.in_proj(patches)
    cls = encoder.special_token.expand(batch, length, 1, -1)
    tokens = torch.cat([cls, tokens], dim=2).reshape(batch * length, patch + 1, -1)
    hidden, _ = encoder.encoder(tokens, is_causal=False)
    return model.enc_to_lm_proj(hidden[:, 0].reshape(batch, length, -1))


class _Gemms(TorchDispatchMode):
    """Records the GEMMs dispatched, and the batched ones with an operand expanded along the batch (stride 0)."""

    def __init__(self) -> None:
        super().__init__()
        self.gemms: list[str] = []
        self.expanded: list[tuple[tuple[int, ...], ...]] = []

    def __torch_dispatch__(
        self, func: Callable[..., Any], types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        name = func.overloadpacket.__name__
        if name in ("mm", "addmm", "bmm", "baddbmm"):
            self.gemms.append(name)
            operands = [a for a in args if isinstance(a, torch.Tensor) and a.dim() == 3]
            if any(operand.stride(0) == 0 for operand in operands):
                self.expanded.append(tuple(tuple(operand.shape) for operand in operands))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_no_projection_runs_a_batched_gemm_on_an_expanded_weight(device: str) -> None:
    """A decode step's LocEnc (patches transposed, one per row: in_proj, then enc_to_lm_proj on the CLS outputs) and a
    LocDiT pass (out_proj on the sequence's patch slice). (On meta SDPA runs as its math ops: batched GEMMs of
    queries and keys, none expanded.)"""
    model = frozen_model(torch.float32, device)
    config, rows = model.config, 6
    estimator = model.feat_decoder.estimator
    hidden = config.dit_config.hidden_dim
    x = torch.randn(rows, config.feat_dim, config.patch_size, device=device)
    mu, t = torch.randn(rows, estimator.mu_tokens * hidden, device=device), torch.rand(rows, device=device)
    with torch.no_grad(), _Gemms() as seen:
        model.embed_patches(decode_patches(model, rows, torch.float32, device))
        estimator(x, mu, t, x, torch.zeros_like(t))
    assert seen.expanded == [], seen.expanded
    assert "mm" in seen.gemms, seen.gemms


class _RequiringGradients:
    """Within the block the model's weights require gradients, as the reference's do (its dispatch of ``matmul``)."""

    def __init__(self, model: VoxCPMModel) -> None:
        self.model = model

    def __enter__(self) -> None:
        self.model.requires_grad_(True)

    def __exit__(self, *_: object) -> None:
        self.model.requires_grad_(False)


@pytest.mark.isa
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_locenc_and_its_projection_into_the_lm_keep_their_values(threads: int, dtype: torch.dtype) -> None:
    """At a decode step (one transposed patch per row) and at a prefill (contiguous patches, several per row)."""
    model = frozen_model(dtype)
    config = model.config
    prefill = torch.randn(2, 5, config.patch_size, config.feat_dim).to(dtype)
    with torch.no_grad():
        for patches in (decode_patches(model, 6, dtype), prefill):
            embedded = model.embed_patches(patches)
            with _RequiringGradients(model):
                assert torch.equal(embedded, embed_as_before(model, patches))
            if dtype == torch.bfloat16:
                assert torch.equal(embedded, embed_as_before(model, patches))


@pytest.mark.isa
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_locdits_output_projection_keeps_its_values(threads: int, dtype: torch.dtype) -> None:
    """On the patch tokens of each row's sequence, a slice of it (VoxCPM2: the last 4 of 11), for 12 rows (CFG's 2 x
    6): one GEMM over the copied rows gives the values of the reference's dispatch and of the batched GEMM."""
    model = frozen_model(dtype)
    out_proj = model.feat_decoder.estimator.out_proj
    patch_tokens = torch.randn(12, 11, out_proj.in_features).to(dtype)[:, -4:]
    with torch.no_grad():
        projected = linear_rows(out_proj, patch_tokens)
        assert torch.equal(projected, out_proj(patch_tokens))
        with _RequiringGradients(model):
            assert torch.equal(projected, out_proj(patch_tokens))
