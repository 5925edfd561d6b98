"""Every Triton kernel compiles for sm_90 (H100/H200) at every specialization the model launches: the real
wrappers at the real call sites, release shapes, server dtypes, through Triton's compiler and ptxas with no
GPU (see compile_sm90.py). The interpreter tests check what the kernels compute; this checks that the GPU
build of them exists, which the interpreter cannot."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.gpu_image import GPU_IMAGE_TRITON
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

from voxwire.kernels import fused, noise, paged_decode, small_attention
from voxwire.kernels.path import NOISE_DTYPES

HERE = Path(__file__).parent


def triton_kernels() -> set[str]:
    """The kernels these modules launch: ``_..._kernel`` (their other jitted functions are inlined device helpers)."""
    return {
        name
        for module in (fused, noise, paged_decode, small_attention)
        for name, value in vars(module).items()
        if isinstance(value, JITFunction | InterpretedFunction)  # compiled, or under the interpreter (conftest)
        and name.endswith("_kernel")
    }


def compile_report(tmp_path: Path, triton_folder: Path | None = None) -> dict[str, Any]:
    """``compile_sm90.py``'s report: compiled by this environment's Triton, or by the one in ``triton_folder``."""
    out = tmp_path / "compiled.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")  # compiled here, not found in a cache
    first = [str(triton_folder)] if triton_folder is not None else []
    env["PYTHONPATH"] = os.pathsep.join([*first, str(HERE.parents[1] / "server"), env.get("PYTHONPATH", "")])
    result = subprocess.run(
        [sys.executable, str(HERE / "compile_sm90.py"), str(out)], env=env, capture_output=True, text=True, timeout=900
    )
    assert out.exists(), result.stderr[-5000:]
    print(result.stdout)  # registers and spills per kernel (issue 34, D11), shown with -s or on a failure
    report: dict[str, Any] = json.loads(out.read_text())
    report["returncode"] = result.returncode
    return report


def assert_every_kernel_compiled(report: dict[str, Any]) -> None:
    assert report["target"] == {"backend": "cuda", "arch": 90, "warp_size": 32}
    assert report["failures"] == [], json.dumps(report["failures"], indent=1)[:5000]
    # Issue 34, D11: no variant spills registers to local memory (a spill is a round trip through L1/L2 per use).
    assert report["spills"] == [], json.dumps(report["spills"], indent=1)[:5000]
    assert report["returncode"] == 0
    every = [variant for variants in report["resources"].values() for variant in variants]
    assert every and all(variant["registers"] > 0 for variant in every)
    compiled = report["specializations"]
    assert set(compiled) == triton_kernels(), "a kernel the model never launches, or one never compiled"
    assert all(count >= 1 for count in compiled.values())
    # The noise kernel's seed and call are not its types: the start-up probe compiles all it will ever run.
    assert compiled["_patch_noise_kernel"] == len(NOISE_DTYPES)
    # Memory-bound kernels hide their loads' latency with resident warps: at least half of an SM's 64.
    for kernel in MEMORY_BOUND_KERNELS:
        for variant in report["resources"][kernel]:
            assert resident_warps(variant["registers"], variant["num_warps"]) >= 32, (kernel, variant)


MEMORY_BOUND_KERNELS = ("_rope_kernel", "_conv_transpose_out_kernel")
SM90_REGISTERS, SM90_WARPS = 65536, 64  # per SM (H100, H200)


def resident_warps(registers: int, num_warps: int) -> int:
    """Warps of a kernel resident on an sm_90 SM as its registers allow: whole programs (CTAs), each thread's
    registers allocated in units of 8, at most the SM's 64 warps."""
    per_warp = -(-registers // 8) * 8 * 32
    return min(SM90_REGISTERS // (per_warp * num_warps) * num_warps, SM90_WARPS // num_warps * num_warps)


@pytest.mark.slow
def test_every_kernel_compiles_for_sm90_at_the_models_call_sites(tmp_path: Path) -> None:
    assert_every_kernel_compiled(compile_report(tmp_path))


@pytest.mark.slow
def test_every_kernel_compiles_for_sm90_with_the_gpu_images_triton(tmp_path: Path) -> None:
    """The same with the Triton the GPU image has, installed apart and put first on the path: the tests' Triton
    may be newer, and a kernel may use what an older compiler lacks."""
    folder = tmp_path / "triton"
    install = ["install", "-q", "--no-deps", "--target", str(folder), f"triton=={GPU_IMAGE_TRITON}"]
    installed = subprocess.run(
        [sys.executable, "-m", "pip", *install],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert installed.returncode == 0, installed.stderr[-3000:]
    report = compile_report(tmp_path, folder)
    assert report["triton"] == GPU_IMAGE_TRITON
    assert_every_kernel_compiled(report)
