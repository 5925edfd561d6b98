"""The benchmark and check scripts keep working: each runs end to end in its small CPU mode."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]


def run_script(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / name), *args], capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def test_gpu_check_smoke_on_cpu(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    result = run_script(
        "gpu_check.py",
        "--device",
        "cpu",
        "--config",
        "voxcpm2",
        "--sessions",
        "1,2",
        "--patches",
        "3",
        "--max-length",
        "128",
        "--out",
        str(out),
    )
    assert "PASS" in result.stdout and out.is_file()


def test_bench_engine_smoke() -> None:
    result = run_script("bench_engine.py", "--patches", "3", "--sessions", "1,2", "--arrival-sessions", "2")
    assert "| 2 |" in result.stdout and "worst" in result.stdout


def test_bench_server_smoke() -> None:
    result = run_script("bench_server.py", "--sessions", "1", "--utterances", "1")
    assert "| 1 |" in result.stdout and "| 48000 | 7680 |" in result.stdout


def test_bench_lora_smoke() -> None:
    result = run_script("bench_lora.py", "--batch", "2", "--rounds", "1", "--threads", "1")
    assert "| 4 personas |" in result.stdout and "| no personas |" in result.stdout
