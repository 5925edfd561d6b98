"""``SimSpeech``: the simulator as a ``SpeechModel``: VoxCPM2's rates and shapes, the packaged speech clip."""

from __future__ import annotations

import math
from functools import cache
from pathlib import Path

import numpy as np
import numpy.typing as npt

from voxwire.audio.clip import AudioSource, load_clip
from voxwire.engine.engine_config import RunnerOptions
from voxwire.engine.outputs import Runner
from voxwire.prompt import Patches, VoicePrompt
from voxwire.sim.runner import SimConfig, SimRunner
from voxwire.speech_model import SIM_MODEL, ModelInfo
from voxwire.voice_clip import VoiceClip

SPEECH_CLIP = Path(__file__).with_name("speech.opus")
"""~14 s of espeak-ng speech, Ogg Opus (made by ``scripts/make_sim_speech.py``)."""
PATCH_SHAPE = (4, 64)
"""VoxCPM2's (patch_size, feat_dim): simulated voices are shaped like real ones."""


@cache
def speech_clip(sample_rate: int) -> npt.NDArray[np.float32]:
    """The packaged clip as float32 mono at ``sample_rate`` (decoded once per rate)."""
    return load_clip(SPEECH_CLIP, sample_rate)


class SimSpeech:
    """No weights: steps sleep per ``config.cost`` and speak the packaged clip. Voices are accepted and
    stored (zero latents of the clip's length, so they cost prefill like real ones) but do not change the audio."""

    def __init__(self, config: SimConfig | None = None) -> None:
        self.config = config if config is not None else SimConfig()
        self.info = ModelInfo(
            SIM_MODEL, self.config.sample_rate, self.config.samples_per_patch, reference_cloning=True, voice_design=True
        )
        self.patch_shape = PATCH_SHAPE

    def make_prompt(self, clip: VoiceClip) -> VoicePrompt:
        return VoicePrompt(
            text=clip.text or "",
            audio_patches=None if clip.audio is None else self._latents(clip.audio, clip.sample_rate),
            reference_patches=None
            if clip.reference_audio is None
            else self._latents(clip.reference_audio, clip.reference_sample_rate),
        )

    def new_runner(self, options: RunnerOptions) -> Runner:
        """A ``SimRunner`` of ``options.num_slots`` slots and ``options.max_length`` positions (4096 by default),
        paced by ``config.cost``; the options that size a real model's memory do not apply."""
        clip = speech_clip(self.config.sample_rate)
        return SimRunner(clip, options.num_slots, self.config, max_length=options.max_length or 4096)

    def _latents(self, source: AudioSource, sample_rate: int | None) -> Patches:
        seconds = load_clip(source, self.config.sample_rate, sample_rate).size / self.config.sample_rate
        return np.zeros((max(1, math.ceil(seconds / self.config.chunk_seconds)), *PATCH_SHAPE), dtype=np.float32)
