"""voxwire: real-time streaming service for the VoxCPM text-to-speech models."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["__version__", "load_model"]

if TYPE_CHECKING:
    from voxwire.loader import load_model


def __getattr__(name: str) -> Any:
    # Importing voxwire must stay cheap (clients never need torch): load_model is resolved lazily.
    if name == "load_model":
        from voxwire.loader import load_model

        return load_model
    raise AttributeError(f"module 'voxwire' has no attribute {name!r}")
