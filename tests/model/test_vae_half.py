"""The AudioVAE in half precision (``load_model(vae_dtype=...)``, ``voxwire serve --vae-dtype``): the
option takes effect, audio still comes out float32, and its error against float32 stays within the bound
docs/performance.md states (measured by scripts/vae_bf16_error.py; the tiny configs here, the full shape there)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import voxwire
from voxwire.tiny.checkpoint import make_tiny_checkpoint

ROOT = Path(__file__).parents[2]


@pytest.mark.parametrize("vae_dtype", ["float16", "bfloat16"])
def test_vae_dtype_option_speaks_float32_audio(tmp_path: Path, vae_dtype: str) -> None:
    checkpoint = make_tiny_checkpoint(tmp_path / "voxcpm2", "voxcpm2")
    exact = voxwire.load_model(checkpoint, device="cpu")
    half = voxwire.load_model(checkpoint, device="cpu", vae_dtype=vae_dtype)
    assert exact.model.audio_vae.dtype == torch.float32
    assert half.model.audio_vae.dtype == getattr(torch, vae_dtype)
    audio, reference = half.generate("Hello.", seed=0, max_len=4), exact.generate("Hello.", seed=0, max_len=4)
    assert audio.dtype == np.float32 and audio.shape == reference.shape
    assert 0 < np.abs(audio - reference).max() < 0.2


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
