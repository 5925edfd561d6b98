"""The AudioVAE in half precision (``load_model(vae_dtype=...)``, ``voxwire serve --vae-dtype``): the
option takes effect, audio still comes out float32, and its error against float32 stays within the bound
docs/performance.md states (measured by scripts/vae_bf16_error.py; the tiny configs here, the full shape there)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

import voxwire
from voxwire.model import audio_vae
from voxwire.model.audio_vae import (
    CHECK_DECODE_ROWS,
    MIN_HALF_VAE_SNR_DB,
    AudioVAE,
    choose_vae_dtype,
    dtype_after_check,
    fold_weight_norm,
    half_precision_check,
    random_published_state_dict,
)
from voxwire.model_config import ModelConfig
from voxwire.params import SynthesisParams
from voxwire.tiny.checkpoint import make_tiny_checkpoint
from voxwire.tiny.configs import ALL_CONFIGS

ROOT = Path(__file__).parents[2]


@pytest.mark.parametrize("vae_dtype", ["float16", "bfloat16"])
def test_vae_dtype_option_speaks_float32_audio(tmp_path: Path, vae_dtype: str) -> None:
    checkpoint = make_tiny_checkpoint(tmp_path / "voxcpm2", "voxcpm2")
    exact = voxwire.load_model(checkpoint, device="cpu")
    half = voxwire.load_model(checkpoint, device="cpu", vae_dtype=vae_dtype)
    assert exact.model.audio_vae.dtype == torch.float32
    assert half.model.audio_vae.dtype == getattr(torch, vae_dtype)
    params = SynthesisParams(seed=0, max_len=4)
    audio, reference = half.generate("Hello.", params), exact.generate("Hello.", params)
    assert audio.dtype == np.float32 and audio.shape == reference.shape
    assert 0 < np.abs(audio - reference).max() < 0.2


@pytest.mark.slow
def test_half_precision_error_bounds(tmp_path: Path) -> None:
    """Signal-to-error ratios of the streaming decode: float16 >= 40 dB, bfloat16 >= 20 dB."""
    for dtype, floor in (("float16", 40.0), ("bfloat16", 20.0)):
        out = tmp_path / f"{dtype}.json"
        command = [sys.executable, str(ROOT / "scripts" / "vae_bf16_error.py"), "--config", "voxcpm-16k,voxcpm2"]
        result = subprocess.run(
            [*command, "--patches", "2", "--dtype", dtype, "--json", str(out)], capture_output=True, text=True
        )
        assert result.returncode == 0, result.stdout + result.stderr
        for measured in json.loads(out.read_text())["results"]:
            assert measured["snr_db"] >= floor, measured


def random_vae(name: str) -> AudioVAE:
    config = ModelConfig.from_dict(ALL_CONFIGS[name], source=name)
    vae = AudioVAE(config.audio_vae_config, config.vae_variant)
    vae.load_state_dict(fold_weight_norm(random_published_state_dict(config.audio_vae_config, config.vae_variant, 0)))
    return vae.eval()


@pytest.mark.parametrize("name", ["voxcpm2", "voxcpm-16k", "voxcpm-44k"])
def test_cuda_default_vae_dtype_is_float16_when_its_error_is_small(name: str) -> None:
    """On CUDA the loader runs the check decode and picks float16 when it is within the floor of float32 (the
    measurement is device-independent arithmetic, so it runs here on the CPU); off CUDA it stays float32."""
    vae, patch_size = random_vae(name), ModelConfig.from_dict(ALL_CONFIGS[name], source=name).patch_size
    measured = half_precision_check(vae, patch_size)
    assert measured.snr_db >= MIN_HALF_VAE_SNR_DB, measured
    assert dtype_after_check(measured) is torch.float16
    assert choose_vae_dtype(vae, patch_size, torch.device("cpu")) is torch.float32


def test_a_vae_that_overflows_in_float16_stays_float32(caplog: pytest.LogCaptureFixture) -> None:
    vae = random_vae("voxcpm2")
    with torch.no_grad():
        vae.decoder.model[0].weight.mul_(1e6)  # activations past float16's 65504
    measured = half_precision_check(vae, 4)
    assert measured.snr_db == -math.inf
    assert dtype_after_check(measured) is torch.float32
    assert "AudioVAE in float32" in caplog.text


@pytest.fixture
def tf32_allowed() -> Iterator[None]:
    """Both TF32 flags on, as a caller may have them, and as they were after. Set and restored by hand: the flags
    are attributes torch answers through ``__getattr__``, which pytest 9.2's monkeypatch takes for absent (its undo
    then deletes them and fails)."""
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    saved = matmul.allow_tf32, cudnn.allow_tf32
    matmul.allow_tf32 = cudnn.allow_tf32 = True
    try:
        yield
    finally:
        matmul.allow_tf32, cudnn.allow_tf32 = saved


@pytest.mark.usefixtures("tf32_allowed")
def test_the_check_decode_compares_with_exact_float32_at_a_serving_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 34, D9: the float32 reference of the check runs without TF32 (cuDNN allows it by default), both flags
    are the caller's again after, and the check decodes a serving batch (>= 64 streams), not one stream."""
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    decodes: list[tuple[torch.dtype, int, bool, bool]] = []  # (VAE dtype, streams, matmul TF32, cuDNN TF32)
    streamed = audio_vae.streamed_audio

    def recorded(vae: AudioVAE, latents: torch.Tensor, patch_size: int) -> torch.Tensor:
        decodes.append((vae.dtype, latents.size(0), matmul.allow_tf32, cudnn.allow_tf32))
        return streamed(vae, latents, patch_size)

    monkeypatch.setattr(audio_vae, "streamed_audio", recorded)
    half_precision_check(random_vae("voxcpm-16k"), 2, patches=1)
    assert CHECK_DECODE_ROWS >= 64
    assert decodes == [(torch.float32, CHECK_DECODE_ROWS, False, False), (torch.float16, CHECK_DECODE_ROWS, True, True)]
    assert matmul.allow_tf32 and cudnn.allow_tf32
