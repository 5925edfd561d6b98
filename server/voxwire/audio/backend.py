"""The compiled audio packages (soundfile, soxr), imported where audio is decoded or resampled, not at import.

The GPU image lacks both, and a server or a measurement that never decodes a clip or changes a rate must still
start there; the first use that needs one fails with a typed error naming the package.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from voxwire.errors import VoxwireError


class AudioBackendMissingError(VoxwireError, ImportError):
    """soundfile or soxr, which decoding or resampling audio needs, is not installed (or cannot load its
    library); the message names the package."""


def audio_backend(name: str) -> ModuleType:
    """The audio package ``name`` ("soundfile" or "soxr"), imported on first use."""
    try:
        return importlib.import_module(name)
    except (ImportError, OSError) as exc:  # OSError: soundfile without a loadable libsndfile
        raise AudioBackendMissingError(
            f"decoding or resampling audio needs the {name} package, which cannot be imported here ({exc}): "
            f"pip install {name}"
        ) from exc
