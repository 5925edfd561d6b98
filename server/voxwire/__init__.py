"""voxwire: real-time streaming service for the VoxCPM text-to-speech models."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["SynthesisParams", "VoiceClip", "__version__", "load_model"]

if TYPE_CHECKING:
    from voxwire.loader import load_model
    from voxwire.params import SynthesisParams
    from voxwire.voice_clip import VoiceClip

_LAZY = {"load_model": "voxwire.loader", "SynthesisParams": "voxwire.params", "VoiceClip": "voxwire.voice_clip"}
"""Name -> the module that defines it: importing voxwire must stay cheap (clients never need torch), so the
library's entry points load on first use."""


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'voxwire' has no attribute {name!r}")
