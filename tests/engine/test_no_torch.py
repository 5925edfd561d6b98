"""The engine's layering: the package (everything but the runner and the modules only it imports) imports without
torch, the runner talks to ``voxwire.model`` without the one-utterance API (``voxwire.tts``), the one-utterance API
and the loader stand below the engine (its scheduler is no part of them), and ``Chunk`` is a leaf type."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import pytest

import voxwire.engine

TORCH_MODULES = {"runner", "cuda_graphs", "kv_pool", "voice_cache"}
"""The engine modules that import torch, as ``voxwire/engine/__init__.py`` names them."""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("module", "absent"),
    [
        ("voxwire.engine", "torch"),
        ("voxwire.chunk", "torch"),
        ("voxwire.engine.runner", "voxwire.tts"),
        ("voxwire.tts", "voxwire.engine"),
        ("voxwire.loader", "voxwire.engine"),
    ],
)
def test_module_does_not_import(module: str, absent: str) -> None:
    code = f"import sys, {module}; assert {absent!r} not in sys.modules, '{module} imported {absent}'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_only_the_runner_s_modules_import_torch() -> None:
    modules = {info.name for info in pkgutil.iter_modules(voxwire.engine.__path__)}
    assert modules >= TORCH_MODULES
    imports = ", ".join(f"voxwire.engine.{name}" for name in sorted(modules - TORCH_MODULES))
    code = f"import sys, {imports}; assert 'torch' not in sys.modules, 'an engine module imported torch'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
