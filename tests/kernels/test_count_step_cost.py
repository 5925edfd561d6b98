"""scripts/count_step_cost.py runs end to end on a tiny config and shows what fusion removes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]


def count(tmp_path: Path, *flags: str) -> list[dict]:
    out = tmp_path / "cost.json"
    command = [sys.executable, str(ROOT / "scripts" / "count_step_cost.py"), "--config", "voxcpm2", "--batch", "1,4"]
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
