"""scripts/count_step_cost.py runs end to end on a tiny config and shows what fusion removes."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from voxwire.config import ModelConfig
from voxwire.tiny.configs import ALL_CONFIGS

ROOT = Path(__file__).parents[2]


def count(tmp_path: Path, *flags: str, config: str = "voxcpm2", batch: str = "1,4") -> list[dict]:
    out = tmp_path / "cost.json"
    command = [sys.executable, str(ROOT / "scripts" / "count_step_cost.py"), "--config", config, "--batch", batch]
    result = subprocess.run([*command, *flags, "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(out.read_text())["rows"]


def test_fused_path_launches_fewer_kernels_and_moves_fewer_bytes(tmp_path: Path) -> None:
    unfused, fused = count(tmp_path), count(tmp_path, "--fused")
    assert [row["batch"] for row in unfused] == [row["batch"] for row in fused] == [1, 4]
    for before, after in zip(unfused, fused, strict=True):
        assert before["kernels"] == before["model_kernels"] + before["vae_kernels"]
        assert before["bytes"] == before["matmul_bytes"] + before["non_matmul_bytes"]
        assert after["kernels"] < before["kernels"] / 2
        assert after["non_matmul_bytes_per_row"] < before["non_matmul_bytes_per_row"] / 2
    # Launches do not grow with the batch: a step is the same kernels at any size.
    assert abs(fused[0]["kernels"] - fused[1]["kernels"]) <= 0.02 * fused[0]["kernels"]


def test_voxcpm2_step_meets_the_kernel_and_traffic_targets(tmp_path: Path) -> None:
    """The review's targets for the CUDA path at VoxCPM2's shape: <= 2,500 kernels per step, <= 130 MB of
    model and <= 80 MB of VAE non-matmul traffic per row, alone and batched."""
    rows = count(tmp_path, "--fused", config="voxcpm2-shape", batch="1,64")
    for row in rows:
        assert row["kernels"] <= 2500
        assert row["model_non_matmul_bytes_per_row"] <= 130e6
        assert row["vae_non_matmul_bytes_per_row"] <= 80e6


def roofline(tmp_path: Path, *flags: str) -> tuple[dict, str]:
    out = tmp_path / "roofline.json"
    command = [sys.executable, str(ROOT / "scripts" / "count_step_cost.py"), "--config", "voxcpm2-shape"]
    command += ["--roofline", "h200", "--batch", "768", *flags, "--json", str(out)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(out.read_text()), result.stdout


def test_roofline_of_the_default_configuration_fits_768_streams(tmp_path: Path) -> None:
    """The counted estimate of the server's default CUDA configuration (bf16 transformers, float16 VAE, fused
    kernels): one step of 768 rows within the 160 ms a 160 ms patch allows, and a lone stream's first audio
    within 25 ms. The printed total is the sum of the printed terms."""
    document, printed = roofline(tmp_path)
    (row,) = document["rows"]
    assert row["batch"] == 768 and document["vae_dtype"] == "float16"
    assert row["step_ms"] == sum(term["ms"] for term in row["roofline"])
    assert row["step_ms"] <= 160.0, row["roofline"]
    assert document["ttfa_ms"] <= 25.0, document
    total_line = next(line for line in printed.splitlines() if line.strip().startswith("total step"))
    assert float(total_line.split()[-1]) == round(row["step_ms"], 2)
    assert f"time to first audio {document['ttfa_ms']:.2f} ms" in printed
    assert all(term["ms"] > 0 for term in row["roofline"])


@pytest.fixture(scope="module")
def cost() -> ModuleType:
    spec = importlib.util.spec_from_file_location("count_step_cost", ROOT / "scripts" / "count_step_cost.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["count_step_cost"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_kv_writes_are_charged_for_what_they_write(cost: ModuleType) -> None:
    """A KV-cache write (``index_put_``) runs over the positions it writes: its programs and bytes do not grow with
    the cache it writes into (they did: 3 ms of a 768-row step at context 256, more at longer ones)."""
    config = ModelConfig.from_dict(ALL_CONFIGS["voxcpm2"], source="voxcpm2")

    def writes(context: int) -> list[tuple[int, int]]:
        counter = cost.CostCounter()
        cost.count_step(config, 2, context, 10, True, counter=counter)
        return [(launch.ctas, launch.moved) for launch in counter.launches if launch.name == "aten.index_put_"]

    short, long = writes(16), writes(1024)
    assert short and short == long


def test_the_step_is_counted_with_the_weights_frozen_as_served(cost: ModuleType) -> None:
    """The server's model needs no gradients, which changes how ``matmul`` dispatches some projections."""
    config = ModelConfig.from_dict(ALL_CONFIGS["voxcpm2"], source="voxcpm2")
    model = cost.build_model(config, True, torch.float16)
    assert not model.training and not any(parameter.requires_grad for parameter in model.parameters())
