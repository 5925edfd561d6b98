"""The reference's calling convention: ``VoxCPM.generate(text=..., prompt_wav_path=..., prompt_text=...,
cfg_value=..., ...)`` (PyPI voxcpm) works on voxwire's model as it does there, so a user of the reference switches by
changing the import. Its signature is read from the reference itself (its environment, ``VOXWIRE_REFERENCE_VENV``)."""

from __future__ import annotations

import inspect
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import soundfile
from tests.venvs import reference_python

from voxwire.errors import InvalidInputError
from voxwire.params import SynthesisParams
from voxwire.text.normalize import normalize, normalizer_available
from voxwire.tts import VoxCPM
from voxwire.voice_clip import VoiceClip

STREAMING_SWITCH = "streaming"
"""The reference's private ``_generate`` flag that its ``generate`` and ``generate_streaming`` set themselves."""
SIGNATURE_SCRIPT = """
import inspect, json
from voxcpm.core import VoxCPM
print(json.dumps([
    {"name": p.name, "default": None if p.default is inspect.Parameter.empty else p.default}
    for p in inspect.signature(VoxCPM._generate).parameters.values() if p.name != "self"
]))
"""
"""The reference's ``generate(*args, **kwargs)`` passes everything to ``_generate``: its parameters and defaults."""


@pytest.fixture(scope="module")
def reference_parameters() -> dict[str, object]:
    """The reference's ``VoxCPM.generate`` keywords with their defaults (``text`` has none: None)."""
    python = reference_python()
    done = subprocess.run([str(python), "-c", SIGNATURE_SCRIPT], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    listed = {entry["name"]: entry["default"] for entry in json.loads(done.stdout.splitlines()[-1])}
    assert {"text", "prompt_wav_path", "cfg_value", "retry_badcase", STREAMING_SWITCH} <= listed.keys()
    return {name: default for name, default in listed.items() if name != STREAMING_SWITCH}


def voice_file(folder: Path, rate: int) -> Path:
    """0.4 s of a tone in a WAV file at ``rate``: a clip to clone."""
    clip = (0.3 * np.sin(2 * np.pi * 220 * np.arange(int(0.4 * rate)) / rate)).astype(np.float32)
    soundfile.write(str(folder / "voice.wav"), clip, rate)
    return folder / "voice.wav"


@pytest.mark.isa
@pytest.mark.parametrize("method", ["generate", "generate_streaming"])
def test_every_reference_keyword_at_its_default_is_the_default_synthesis(
    tiny_tts: VoxCPM, reference_parameters: dict[str, object], method: str
) -> None:
    ours = inspect.signature(getattr(tiny_tts, method)).parameters
    assert not reference_parameters.keys() - ours.keys(), "keywords the reference takes and voxwire does not"
    defaults = {name: default for name, default in reference_parameters.items() if name != "text"}
    # max_len lowered to keep the utterance short; the seed is voxwire's (the reference seeds torch's generator)
    called = getattr(tiny_tts, method)(text="The reference's way.", seed=5, **{**defaults, "max_len": 6})
    audio = called if method == "generate" else np.concatenate(list(called))
    expected = tiny_tts.generate("The reference's way.", SynthesisParams(seed=5, max_len=6))
    assert np.array_equal(audio, expected)


@pytest.mark.isa
def test_a_call_made_the_references_way_sounds_like_synthesis_params_and_a_voice_clip(
    tiny_tts: VoxCPM, tmp_path: Path
) -> None:
    clip = voice_file(tmp_path, tiny_tts.sample_rate)
    theirs = tiny_tts.generate(
        text="Now something new.", prompt_wav_path=str(clip), prompt_text="My voice.", reference_wav_path=str(clip),
        cfg_value=1.5, inference_timesteps=4, min_len=1, max_len=7, seed=11,
    )  # fmt: skip
    voice = tiny_tts.make_prompt(VoiceClip(text="My voice.", audio=clip, reference_audio=clip))
    params = SynthesisParams(cfg_value=1.5, inference_timesteps=4, min_len=1, max_len=7, seed=11)
    assert np.array_equal(theirs, tiny_tts.generate("Now something new.", params, prompt=voice))
    assert not np.array_equal(theirs, tiny_tts.generate("Now something new.", params))  # the voice was used


@pytest.mark.isa
@pytest.mark.skipif(not normalizer_available(), reason="needs the normalize extra")
def test_normalize_reads_the_text_as_words_first(tiny_tts: VoxCPM) -> None:
    text = "It costs $12.50."
    audio = tiny_tts.generate(text=text, normalize=True, seed=4, max_len=5)
    assert np.array_equal(audio, tiny_tts.generate(normalize(text), SynthesisParams(seed=4, max_len=5)))


@pytest.mark.parametrize(
    ("keywords", "named"),
    [
        ({"denoise": True}, "denoise"),
        ({"retry_badcase_max_times": 5}, "retry_badcase_max_times"),
        ({"retry_badcase_ratio_threshold": 3.0}, "retry_badcase_ratio_threshold"),
        ({"prompt_text": "A transcript without its clip."}, "together"),
    ],
)
def test_a_reference_keyword_voxwire_cannot_honour_is_refused_by_name(
    tiny_tts: VoxCPM, keywords: dict, named: str
) -> None:
    with pytest.raises(InvalidInputError, match=named):
        tiny_tts.generate(text="Hello.", **keywords)


def test_retry_badcase_either_way_is_accepted_since_voxwire_never_retries(tiny_tts: VoxCPM) -> None:
    for retry in (True, False):
        assert tiny_tts.generate(text="Hello.", retry_badcase=retry, seed=1, max_len=3).size > 0


def test_settings_or_a_voice_given_twice_are_refused(tiny_tts: VoxCPM, tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="cfg_value"):
        tiny_tts.generate("Hello.", SynthesisParams(seed=1), cfg_value=1.5)
    clip = voice_file(tmp_path, tiny_tts.sample_rate)
    voice = tiny_tts.make_prompt(VoiceClip(reference_audio=clip))
    with pytest.raises(TypeError, match="reference_wav_path"):
        tiny_tts.generate("Hello.", prompt=voice, reference_wav_path=str(clip))
