"""The kernel path is decided once per device and followed by every kernel; off CUDA, Triton stays out of the
process (no nanobind "leaked" reports at exit)."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from tests.server_process import ServerProcess

from voxwire.kernels import ops, path
from voxwire.model import paged_attention

SERVER = str(Path(__file__).parents[2] / "server")
CUDA = torch.device("cuda:0")


def run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    environment.update(PYTHONPATH=SERVER, OMP_NUM_THREADS="1", **env)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=environment, capture_output=True, text=True, timeout=600
    )


@pytest.mark.slow
def test_cpu_generation_never_imports_triton() -> None:
    result = run_python(
        """
        import sys
        import voxwire
        from voxwire.params import SynthesisParams
        model = voxwire.load_model("demo", device="cpu")
        audio = model.generate("hello there", SynthesisParams(max_len=4, seed=1))
        assert audio.size > 0
        print("triton imported:", "triton" in sys.modules)
        """
    )
    assert result.returncode == 0, result.stderr
    assert "triton imported: False" in result.stdout
    assert "leaked" not in result.stderr


@pytest.mark.slow
def test_cpu_server_exits_without_triton_leak_reports() -> None:
    server = ServerProcess("--model", "demo", "--device", "cpu")
    try:
        server.wait_ready(timeout=120)
        assert server.stop() == 0
    finally:
        server.process.kill()
    assert "leaked" not in server.log, server.log[-3000:]


class BrokenTriton(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """A Triton that is installed but fails as it loads, as one built for another CUDA driver does."""

    def find_spec(self, name: str, import_path: object, target: object = None) -> importlib.machinery.ModuleSpec | None:
        return importlib.machinery.ModuleSpec(name, self) if name == "triton" else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None

    def exec_module(self, module: object) -> None:
        raise OSError("libtriton.so: undefined symbol: cuModuleGetFunction")


def broken_triton_probe(device: torch.device) -> str | None:
    """``path.probe_triton`` in a process whose Triton is ``BrokenTriton`` (the real one set aside meanwhile)."""
    kernel_modules = ("triton", "voxwire.kernels.fused", "voxwire.kernels.paged_decode")
    saved = {name: module for name, module in sys.modules.items() if name.startswith(kernel_modules)}
    for name in saved:
        del sys.modules[name]
    finder = BrokenTriton()
    sys.meta_path.insert(0, finder)
    try:
        return path.probe_triton(device)
    finally:
        sys.meta_path.remove(finder)
        for name in [name for name in sys.modules if name.startswith(kernel_modules)]:
            del sys.modules[name]
        sys.modules.update(saved)


def test_broken_triton_falls_back_for_everything_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    failure = broken_triton_probe(torch.device("cpu"))
    assert failure is not None and "undefined symbol" in failure
    with caplog.at_level(logging.INFO, logger=path.logger.name):
        chosen = path.decide(CUDA, path.KernelPolicy.AUTO, lambda device: failure)
    assert chosen is path.KernelPath.TORCH
    assert "plain torch for the fused ops and decode attention" in caplog.text and "undefined symbol" in caplog.text


def test_broken_triton_is_a_start_up_error_when_triton_is_required() -> None:
    with pytest.raises(path.TritonUnavailableError, match=r"VOXWIRE_KERNELS=triton.*ImportError"):
        path.decide(CUDA, path.KernelPolicy.TRITON, lambda device: "ImportError: no triton")


def test_a_working_triton_passes_the_probe(caplog: pytest.LogCaptureFixture) -> None:
    """The real probe on the CPU, through the interpreter (see conftest): compiled, launched, matched."""
    with caplog.at_level(logging.INFO, logger=path.logger.name):
        assert path.decide(torch.device("cpu"), path.KernelPolicy.AUTO, path.probe_triton) is path.KernelPath.TRITON
    assert "Triton" in caplog.text


def test_forcing_plain_torch_never_probes() -> None:
    def probe(device: torch.device) -> str | None:
        raise AssertionError("probed")

    assert path.decide(CUDA, path.KernelPolicy.TORCH, probe) is path.KernelPath.TORCH


@pytest.mark.parametrize("chosen", list(path.KernelPath))
def test_fused_ops_and_decode_attention_follow_one_decision(
    chosen: path.KernelPath, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever was decided for a CUDA device, decode attention names the same path the fused ops take."""
    monkeypatch.setitem(path._paths, CUDA, chosen)
    assert path.uses_triton(CUDA) is (chosen is path.KernelPath.TRITON)
    expected = "triton-paged" if chosen is path.KernelPath.TRITON else "torch-paged"
    assert paged_attention.attention_path(CUDA) == expected
    assert not path.uses_triton(torch.device("cpu"))
    assert ops._fused(torch.empty(2)) is False


def test_bad_policy_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(path.ENV_VAR, "fast")
    with pytest.raises(ValueError, match="VOXWIRE_KERNELS='fast'"):
        path.KernelPolicy.from_env()


def test_the_probes_run_with_their_device_current(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Triton kernel launches on the current device, so probing cuda:1 from a thread on cuda:0 must make
    cuda:1 current first, or the probe fails (or passes) for the wrong device."""
    current = [0]

    class Current:
        def __init__(self, device: torch.device) -> None:
            self.index = torch.device(device).index

        def __enter__(self) -> None:
            self.previous, current[0] = current[0], self.index

        def __exit__(self, *exc: object) -> None:
            current[0] = self.previous

    seen: dict[str, int] = {}

    def probe(name: str) -> path.Probe:
        def run(device: torch.device) -> str | None:
            seen[name] = current[0]
            return None

        return run

    second = torch.device("cuda", 1)
    monkeypatch.setattr(torch.cuda, "device", Current)
    monkeypatch.setattr(path, "probe_triton", probe("triton"))
    monkeypatch.setattr(path, "probe_noise", probe("noise"))
    monkeypatch.setattr(path, "_paths", {})  # nothing decided yet
    monkeypatch.setattr(path, "_noise_paths", {})
    monkeypatch.setenv(path.ENV_VAR, "auto")
    assert path.noise_path(second) is path.NoisePath.ONE_LAUNCH
    assert seen == {"triton": 1, "noise": 1} and current[0] == 0
