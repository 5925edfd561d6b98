"""Stand-in for torchaudio inside the reference-fixture environment only.

No torchaudio build matches torch 2.13, and the reference (PyPI voxcpm 2.0.3) imports it at module
level just to read prompt files and resample them. Fixtures always pass audio already at the model's
sample rate, so reading with soundfile is all that is needed; anything else fails loudly.
"""

from __future__ import annotations

from pathlib import Path

import soundfile
import torch

from . import functional  # noqa: F401


def load(path: str | Path, *args: object, **kwargs: object) -> tuple[torch.Tensor, int]:
    data, sample_rate = soundfile.read(str(path), dtype="float32", always_2d=True)
    return torch.from_numpy(data.T.copy()), sample_rate
