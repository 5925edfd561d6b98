"""``scripts/gpu_check.py``: its CPU smoke run goes through every phase on an interpreter without the packages the
GPU image lacks, its correctness gate can fail, its fusion check notices an unfused layer, and the runner it
measures is built from the server's defaults."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import numpy as np
import pytest
import torch
from tests.gpu_image import ROOT, run_as_on_gpu_image
from tests.script_modules import load_script

PHASES = [
    "env",
    "build",
    "fusion",
    "correctness",
    "server_setup",
    "step_curve",
    "timesteps_50",
    "ttfa",
    "kernel_shapes",
    "kernel_timing",
    "profile",
    "admission_noise",
]


@pytest.fixture(scope="module")
def gpu_check() -> ModuleType:
    return load_script(ROOT / "scripts" / "gpu_check.py", "gpu_check")


@pytest.mark.slow
def test_smoke_runs_every_phase_without_the_packages_the_gpu_image_lacks(tmp_path: Path) -> None:
    result = run_as_on_gpu_image("script", "scripts/gpu_check.py", "--smoke", "--out", str(tmp_path))
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "RESULT: OK" in result.stdout
    data = json.loads((tmp_path / "gpu_check.json").read_text())
    phases = data["phases"]
    assert list(phases) == PHASES
    assert {name: entry["status"] for name, entry in phases.items() if entry["status"] != "ok"} == {
        "kernel_timing": "skipped"
    }
    assert phases["kernel_timing"]["reason"] == "skipped: no CUDA"
    assert phases["env"]["result"]["fused_ops"] == "torch"
    assert data["tf32_unchanged"] is True

    assert phases["fusion"]["result"]["unfused_count"] == 0 and phases["fusion"]["result"]["modules_checked"] > 0
    correctness = phases["correctness"]["result"]
    gate = correctness["batch_invariant"]["batched_vs_alone"]
    assert correctness["gate"]["passed"] is True
    assert gate["bit_identical"] == gate["sessions"] == correctness["sessions"] >= 3
    assert correctness["default"]["batched_vs_alone"]["sessions"] == correctness["sessions"]
    # The burst of copies runs 16 rows or more, where CUDA's reductions may order a row's sum differently.
    burst = correctness["batch_invariant"]["burst_vs_alone"]
    assert burst["bit_identical"] == burst["sessions"] >= 16 and burst["widest_step_sessions"] >= 16

    launches = phases["kernel_shapes"]["result"]["launches_per_op"]
    fused = {"voxwire::rms_norm", "voxwire::add_rms_norm", "voxwire::rope_qk", "voxwire::silu_mul"}
    assert fused <= set(launches) and "paged_decode_attention" in launches
    assert any(op.startswith("voxwire::") and "snake" in op for op in launches)

    setup = phases["server_setup"]["result"]
    assert setup["sessions"] == 4 and setup["max_timesteps"] == 50 and setup["capture"] == "skipped: no CUDA"
    assert setup["memory"]["kv_pool_gib"] > 0 and setup["memory"]["weights_gib"] > 0
    assert setup["step_cost_seconds"] > 0 and setup["untimed"] == []  # the server measures its step cost
    curve = phases["step_curve"]["result"]
    assert [p["sessions"] for p in curve["points"]] == [1, 2, 4]
    assert all(p["decode_steps"] >= 1 and p["graph_captures_during_run"] == 0 for p in curve["points"])
    assert {"fixed_ms", "per_row_ms", "rows_at_160ms_fit", "largest_measured_rows_within_160ms"} <= set(curve["fit"])
    # Beside each measured step, scripts/count_step_cost.py's prediction (the H200's ceilings where there is no GPU).
    assert curve["cost_model"]["ceilings"] == "h200" and curve["cost_model"]["largest"]["rows"] == 4
    assert all(p["model_realistic_ms"] >= p["model_best_ms"] > 0 and p["model_context"] > 2 for p in curve["points"])
    assert "cost model (h200 ceilings), realistic / best: 1: " in result.stdout
    t50 = phases["timesteps_50"]["result"]
    assert t50["rows"] == 4 and all(t50[run] > 0 for run in ("all_rows_t10", "all_rows_t50", "one_t50_among_t10"))
    assert phases["ttfa"]["result"]["ms_median"] > 0
    noise = phases["admission_noise"]["result"]
    assert noise["equal"] is True and noise["path"] == "one randn call (CPU)" and noise["take_ms"] > 0


def test_the_correctness_comparison_finds_a_one_bit_difference(gpu_check: ModuleType) -> None:
    audio = np.linspace(-0.5, 0.5, 30, dtype=np.float32)
    flipped = audio.copy()
    flipped.view(np.uint32)[17] ^= 1  # one ulp, in the third patch of 8 samples
    same = gpu_check.compare({"a": audio, "b": audio}, {"a": audio.copy(), "b": audio.copy()}, 8)
    assert same["bit_identical"] == 2 and same["first_differing_patch"] is None
    differs = gpu_check.compare({"a": audio, "b": audio}, {"a": audio.copy(), "b": flipped}, 8)
    assert differs["bit_identical"] == 1 and differs["first_differing_patch"] == 2 and differs["max_abs_diff"] > 0
    shorter = gpu_check.compare({"a": audio}, {"a": audio[:-1]}, 8)
    assert shorter["bit_identical"] == 0 and shorter["length_mismatches"] == ["a"]


@pytest.mark.parametrize("chosen", ["triton", "torch"])
def test_env_fails_on_cuda_unless_the_fused_ops_run_triton(
    gpu_check: ModuleType, monkeypatch: pytest.MonkeyPatch, chosen: str
) -> None:
    """Issue 34, D7: env reports the path the start-up probe chose, and a plain-torch fallback on CUDA fails it."""
    from voxwire.kernels import path

    device = torch.device("cuda", 0)
    # Stand-ins for a CUDA device on which the start-up decided ``chosen``.
    monkeypatch.delenv(path.ENV_VAR, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    properties = SimpleNamespace(name="stand-in", major=9, minor=0, multi_processor_count=132, total_memory=2**37)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda _: properties)
    monkeypatch.setitem(path._paths, device, path.KernelPath(chosen))
    monkeypatch.setitem(path._noise_paths, device, path.NoisePath.ONE_LAUNCH)
    monkeypatch.setattr(gpu_check, "probe_triton", lambda _: "stand-in: ptxas cannot compile for sm_90")
    outcome = gpu_check.check_env(gpu_check.make_plan(gpu_check.parse_args(["--device", "cuda:0"])))
    assert outcome.result["fused_ops"] == chosen
    assert outcome.result["attention_path"] == f"{chosen}-paged"
    if chosen == "triton":
        assert outcome.failures == []
    else:
        assert outcome.result["fused_ops_fallback"] == "stand-in: ptxas cannot compile for sm_90"
        assert len(outcome.failures) == 1 and "plain torch on cuda:0" in outcome.failures[0]
        monkeypatch.setenv(path.ENV_VAR, "torch")
        assert gpu_check.check_env(gpu_check.make_plan(gpu_check.parse_args(["--device", "cuda:0"]))).failures == [
            "the fused ops and decode attention run plain torch on cuda:0, not the server's Triton kernels: "
            "VOXWIRE_KERNELS=torch"
        ]


def test_the_help_gives_the_vae_dtype_the_server_picks(
    gpu_check: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 34, D8: on CUDA the loader runs the VAE in ``HALF_VAE_DTYPE`` when its check decode passes."""
    from voxwire.model.audio_vae import HALF_VAE_DTYPE

    half = str(HALF_VAE_DTYPE).removeprefix("torch.")
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["--help"])
    assert f"on CUDA {half} when its check decode passes, else float32" in " ".join(capsys.readouterr().out.split())
    assert f"on CUDA a {half} AudioVAE when its check decode against float32 passes" in " ".join(
        gpu_check.__doc__.split()
    )


def test_the_fusion_check_fails_when_a_projection_runs_on_its_own(gpu_check: ModuleType) -> None:
    plan = gpu_check.make_plan(gpu_check.parse_args(["--smoke"]))
    tts, _ = gpu_check.build_model(plan)
    assert gpu_check.check_fusion(tts).failures == []
    attention = tts.model.base_lm.layers[1].self_attn
    replaced = torch.nn.Linear(attention.q_proj.in_features, attention.q_proj.out_features, bias=False)
    replaced.weight = torch.nn.Parameter(attention.q_proj.weight.detach().clone())
    attention.q_proj = replaced  # as a LoRA wrapper or a cast would: the fused weight no longer serves it
    outcome = gpu_check.check_fusion(tts)
    assert outcome.result["unfused"] == ["base_lm.layers.1.self_attn (4 GEMMs)"]
    assert outcome.failures


def test_setup_timing_times_every_key_the_engine_captures(gpu_check: ModuleType) -> None:
    from voxwire.engine.cuda_graphs import StepGraphs

    graphs = StepGraphs(lambda bucket, timesteps: torch.zeros(bucket, 1), (1, 2, 4), (10, 50))
    graphs._capture = lambda bucket, timesteps: (lambda: None, torch.zeros(bucket, 1))  # no CUDA graph here
    with gpu_check.timed_setup(torch.device("cpu")) as times:
        graphs.capture_all()
    assert [(k["bucket"], k["timesteps"]) for k in times.keys] == [(b, t) for b in (4, 2, 1) for t in (50, 10)]
    assert times.capture_began <= times.capture_ended and times.untimed == []
    assert graphs.captures == 6
    assert "timed" not in repr(StepGraphs.capture_all) and "partial" not in repr(StepGraphs._add)  # restored


LAUNCH_EVERY_RECORDED_CALL = """
import importlib.util, sys
import torch
spec = importlib.util.spec_from_file_location("gpu_check", "scripts/gpu_check.py")
gpu_check = importlib.util.module_from_spec(spec)
sys.modules["gpu_check"] = gpu_check
spec.loader.exec_module(gpu_check)
from voxwire.kernels import fused, small_attention

plan = gpu_check.make_plan(gpu_check.parse_args(["--smoke"]))
tts, _ = gpu_check.build_model(plan)
calls = gpu_check.record_kernel_calls(tts, plan)
# The CUDA implementations of the custom ops, on CPU tensors through Triton's interpreter.
for name in {call.label.removeprefix("voxwire::") for call in calls if call.label.startswith("voxwire::")}:
    wrapper = getattr(fused, name, None) or getattr(small_attention, name)
    torch.library.register_kernel(f"voxwire::{name}", "cpu", wrapper)
for call in calls:
    out = call.launcher(torch.device("cpu"))()
    for tensor in out if isinstance(out, tuple) else (out,):
        assert torch.isfinite(tensor).all(), call
print(len(calls))
"""


@pytest.mark.slow
def test_every_recorded_kernel_call_launches_with_its_recorded_arguments() -> None:
    # What kernel_timing launches on CUDA: each call of the step rebuilt from its recorded layouts and arguments.
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT / "server")}
    result = subprocess.run(
        [sys.executable, "-c", LAUNCH_EVERY_RECORDED_CALL],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env=env,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert int(result.stdout.split()[-1]) > 10
