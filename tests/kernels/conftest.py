"""The Triton kernels run compiled on a CUDA device when there is one, and otherwise on CPU tensors through
Triton's interpreter.

``triton.jit`` picks compiled or interpreted execution when a kernel module is imported, reading
``TRITON_INTERPRET`` then. So without CUDA it is set here, at conftest import (before any test module of
this package imports a kernel), and any kernel module an earlier test already imported is reloaded, so
the tests below get interpreted kernels whatever ran first in the process.
"""

from __future__ import annotations

import importlib
import os
import sys

import pytest
import torch

TRITON_MODULES = (
    "voxwire.kernels.paged_decode",
    "voxwire.kernels.fused",
    "voxwire.kernels.noise",
    "voxwire.kernels.small_attention",
)

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
    for _name in TRITON_MODULES:
        if _name in sys.modules:
            importlib.reload(sys.modules[_name])


@pytest.fixture
def device() -> torch.device:
    """Where the kernels under test run: CUDA when present, else CPU (interpreted)."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
