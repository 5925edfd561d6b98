"""Without soundfile and soxr (the GPU image) the model and its API import, and reading a clip fails with a typed
error that names the missing package, while an array at the model's rate needs neither."""

from __future__ import annotations

import pytest
from tests.gpu_image import run_as_on_gpu_image

CHECK = """
import numpy as np
import voxwire.tts  # the model's one-utterance API, which names AudioSource
from voxwire.audio.backend import AudioBackendMissingError
from voxwire.audio.clip import load_clip
from voxwire.errors import VoxwireError

samples = np.linspace(-0.5, 0.5, 1600, dtype=np.float32)
assert np.array_equal(load_clip(samples, 16000, 16000), samples)
for source, rate, package in ((b"RIFF....WAVE", None, "soundfile"), (samples, 24000, "soxr")):
    try:
        load_clip(source, 16000, rate)
    except AudioBackendMissingError as exc:
        assert isinstance(exc, VoxwireError) and isinstance(exc, ImportError)
        assert f"needs the {package} package" in str(exc), exc
    else:
        raise AssertionError(f"reading without {package} did not fail")
print("ok")
"""


@pytest.mark.slow
def test_clips_without_soundfile_or_soxr_fail_with_a_typed_error_naming_the_package() -> None:
    result = run_as_on_gpu_image("-c", CHECK, timeout=300)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stdout + result.stderr
