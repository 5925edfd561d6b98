"""Running Python as on the GPU image: torch, Triton, numpy, safetensors, tokenizers, huggingface_hub, aiohttp,
uvloop and prometheus-client are there, voxwire's other dependencies are not, and voxwire is not installed
(``PYTHONPATH=server``). The missing packages are hidden from the import system, so importing one fails exactly
as it does where it is not installed (``ModuleNotFoundError``; ``importlib.util.find_spec`` returns None)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]
GPU_IMAGE_TRITON = "3.6.0"
"""The Triton version on the GPU image (with torch 2.11)."""
NOT_ON_GPU_IMAGE = ("soundfile", "soxr", "opuslib", "av", "zmq", "websockets", "cffi")

_HIDE = """
import importlib.machinery, sys
hidden = set(sys.argv[1].split(","))

class _PathFinderWithout(importlib.machinery.PathFinder):
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name.partition(".")[0] in hidden:
            return None
        return super().find_spec(name, path, target)

sys.meta_path[:] = [_PathFinderWithout if f is importlib.machinery.PathFinder else f for f in sys.meta_path]
for name in [m for m in sys.modules if m.partition(".")[0] in hidden]:
    del sys.modules[name]
mode, target = sys.argv[2], sys.argv[3]
sys.argv = sys.argv[3:]
if mode == "-c":
    exec(compile(target, "<gpu-image>", "exec"), {"__name__": "__main__"})
else:
    import runpy
    runpy.run_path(target, run_name="__main__")
"""


def run_as_on_gpu_image(
    mode: str, target: str, *args: str, timeout: float = 600, hidden: tuple[str, ...] = NOT_ON_GPU_IMAGE
) -> subprocess.CompletedProcess[str]:
    """Run ``target`` (mode ``"-c"``: code; ``"script"``: a script's path) with ``args`` from the repository root,
    the packages in ``hidden`` unimportable and voxwire imported from ``server/``."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "server"), os.environ.get("PYTHONPATH")])),
    }
    command = [sys.executable, "-c", _HIDE, ",".join(hidden), mode, target, *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)
