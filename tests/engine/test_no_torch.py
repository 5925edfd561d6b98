"""The engine's layering: the package (everything but the runner) imports without torch, the runner talks to
``voxwire.model`` without the one-utterance API (``voxwire.tts``), and ``Chunk`` is a leaf type."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.slow
@pytest.mark.parametrize(
    ("module", "absent"),
    [
        ("voxwire.engine", "torch"),
        ("voxwire.chunk", "torch"),
        ("voxwire.engine.runner", "voxwire.tts"),
    ],
)
def test_module_does_not_import(module: str, absent: str) -> None:
    code = f"import sys, {module}; assert {absent!r} not in sys.modules, '{module} imported {absent}'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
