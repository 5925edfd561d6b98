"""``VoiceClip``: what a voice is encoded from, checked once for every encoder, and light enough for a frontend."""

from __future__ import annotations

import pickle
import subprocess
import sys

import numpy as np
import pytest

from voxwire.errors import InvalidInputError
from voxwire.sim.model import SimSpeech
from voxwire.voice_clip import VoiceClip


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        pytest.param({"text": "only text"}, "together", id="text without audio"),
        pytest.param({"audio": "me.wav"}, "together", id="audio without text"),
        pytest.param({}, "reference audio", id="nothing"),
        pytest.param({"sample_rate": 16000}, "reference audio", id="only a rate"),
    ],
)
def test_an_incomplete_clip_is_refused_naming_what_is_missing(fields: dict, match: str) -> None:
    with pytest.raises(InvalidInputError, match=match):
        VoiceClip(**fields)


def test_every_encoder_refuses_the_same_clips() -> None:
    """The simulator takes the clip the real model takes: the rule lives in the value, not in each encoder."""
    clip = np.zeros(4800, dtype=np.float32)
    prompt = SimSpeech().make_prompt(VoiceClip("Hello.", clip, 48000, clip, 48000))
    assert prompt.text == "Hello." and prompt.audio_patches is not None and prompt.reference_patches is not None
    only_reference = SimSpeech().make_prompt(VoiceClip(reference_audio=clip, reference_sample_rate=48000))
    assert only_reference.audio_patches is None and only_reference.reference_patches is not None


def test_a_clip_crosses_to_the_engine_process_intact() -> None:
    clip = VoiceClip("Hi.", np.arange(8, dtype=np.float32), 16000)
    back = pickle.loads(pickle.dumps(clip))
    assert (back.text, back.sample_rate, back.reference_audio) == ("Hi.", 16000, None)
    np.testing.assert_array_equal(back.audio, clip.audio)


def test_the_module_needs_no_torch() -> None:
    code = "import sys, voxwire.voice_clip; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
