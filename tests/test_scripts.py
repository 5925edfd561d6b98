"""The benchmark and check scripts keep working: each runs end to end in its small CPU mode."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import soundfile

from voxwire.model_config import ModelConfig
from voxwire.tiny.configs import ALL_CONFIGS

ROOT = Path(__file__).parents[1]


def run_script(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / name), *args], capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result


@pytest.mark.slow
def test_bench_engine_smoke() -> None:
    result = run_script("bench_engine.py", "--patches", "3", "--sessions", "1,2", "--arrival-sessions", "2")
    assert "| 2 |" in result.stdout and "worst" in result.stdout


@pytest.mark.slow
def test_bench_throughput_smoke(tmp_path: Path) -> None:
    out = tmp_path / "throughput.json"
    args = ("--config", "voxcpm2", "--patches", "2", "--concurrency", "1,2", "--threads", "1", "--json", str(out))
    result = run_script("bench_throughput.py", *args)
    assert "| 2 |" in result.stdout
    levels = json.loads(out.read_text())["levels"]
    assert [level["concurrency"] for level in levels] == [1, 2]
    config = ModelConfig.from_dict(ALL_CONFIGS["voxcpm2"], source="voxcpm2")
    request_s = 2 * config.samples_per_patch / config.sample_rate
    for level in levels:  # every request of both engines made its fixed length, and each has an RTF
        for mode in ("realtime", "no_realtime"):
            assert level[mode]["audio_s"] == pytest.approx(level["concurrency"] * request_s)
            assert level[mode]["rtf_p90"] >= level[mode]["rtf_p50"] > 0


@pytest.mark.slow
def test_bench_server_smoke() -> None:
    result = run_script("bench_server.py", "--sessions", "1", "--utterances", "1")
    assert "| 1 |" in result.stdout and "| 48000 | 7680 |" in result.stdout


def _simulate(tmp_path: Path, *args: str) -> dict:
    out = tmp_path / "load.json"
    window = ("--warmup-s", "5", "--duration-s", "10", "--tail-s", "5")
    run_script("simulate_load.py", "--streams", "4,8", *window, "--json", str(out), *args)
    return json.loads(out.read_text())


def test_simulate_load_reports_each_level_for_both_policies(tmp_path: Path) -> None:
    result = _simulate(tmp_path, "--cost", "4ms+0.17ms/row+9.2us/token")
    keys = {"streams", "ttfa_p50_ms", "ttfa_p99_ms", "late_chunks", "mean_batch"}
    for levels in (result["levels"], result["baseline"]["levels"]):
        assert [level["streams"] for level in levels] == [4, 8]
        for level in levels:
            assert keys <= set(level)
            assert level["chunks"] > 0 and level["late_chunks"] == 0 and level["mean_batch"] >= 1
            # No first chunk before one step: 4 ms + one row + the prefill of at least 64 prompt tokens.
            assert level["ttfa_p50_ms"] >= 4.7 and level["ttfa_p99_ms"] >= level["ttfa_p50_ms"]


def test_simulate_load_counts_late_chunks_when_a_step_outlasts_its_audio(tmp_path: Path) -> None:
    # A 200 ms step for 160 ms of audio: no policy can keep up, and the report must say so.
    result = _simulate(tmp_path, "--cost", "200ms+1ms/row", "--only-realtime")
    assert "baseline" not in result
    for level in result["levels"]:
        assert level["late_chunks"] > 0 and level["ttfa_p50_ms"] >= 200


@pytest.mark.slow
def test_count_prefill_cost_counts_less_for_audio_only_locenc_and_cached_voices(tmp_path: Path) -> None:
    out = tmp_path / "prefill.json"
    run_script("count_prefill_cost.py", "--config", "voxcpm2", "--prompt-seconds", "2", "--json", str(out))
    cloned, zero_shot = json.loads(out.read_text(encoding="utf-8"))["rows"]
    assert cloned["audio_positions"] > 0 and zero_shot["audio_positions"] == 0
    assert cloned["gflop_locenc_every_position"] > cloned["gflop_locenc_audio_only"] > cloned["gflop_voice_cached"]
    assert zero_shot["gflop_locenc_every_position"] > zero_shot["gflop_locenc_audio_only"]


@pytest.mark.slow
def test_bench_lora_smoke() -> None:
    result = run_script("bench_lora.py", "--batch", "2", "--rounds", "1", "--threads", "1")
    assert "| 4 personas |" in result.stdout and "| no personas |" in result.stdout


@pytest.mark.slow
def test_bench_batch_invariant_smoke() -> None:
    result = run_script("bench_batch_invariant.py", "--batches", "1,2", "--rounds", "1")
    assert "| 1 |" in result.stdout and "| 2 |" in result.stdout


def test_bench_opus_smoke(tmp_path: Path) -> None:
    out = tmp_path / "opus.json"
    args = ("--complexities", "0,6", "--bitrates", "32000", "--seconds", "2", "--repeats", "1", "--json", str(out))
    result = run_script("bench_opus.py", *args)
    assert "| 32 | 6 |" in result.stdout
    rows = json.loads(out.read_text())["rows"]
    assert [row["complexity"] for row in rows] == [0, 6] and all(row["spectral_snr_db"] > 10 for row in rows)


def test_make_sim_speech_renders_a_small_speech_clip(tmp_path: Path) -> None:
    out = tmp_path / "speech.opus"
    run_script("make_sim_speech.py", "--out", str(out))
    assert 10_000 < out.stat().st_size < 200_000
    assert soundfile.info(str(out)).duration > 5
