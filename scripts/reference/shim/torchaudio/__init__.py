"""Stand-in for torchaudio inside the reference-fixture environment only.

No torchaudio build matches torch 2.13, and the reference (PyPI voxcpm 2.0.3) imports it at module
level just to read prompt files and resample them. Fixtures always pass audio already at the model's
sample rate, so reading with soundfile is all that is needed; anything else fails loudly.
"""

import soundfile
import torch

from . import functional  # noqa: F401


def load(path, *args, **kwargs):
    data, sample_rate = soundfile.read(str(path), dtype="float32", always_2d=True)
    return torch.from_numpy(data.T.copy()), sample_rate
