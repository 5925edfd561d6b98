"""``SpeechModel``: what serving needs from a model, whatever runs it (a loaded VoxCPM or the simulator).

The service asks a ``SpeechModel`` for its description (``ModelInfo``), the shape of its voice latents,
voice encoding, and a ``Runner`` for the engine (which lays each request's text out: ``Runner.prepare``).
The contract lives here, below serving, so that both implementations (``VoxCPMSpeech`` below and
``voxwire.sim.SimSpeech``) stand under the service that uses them; ``serving.speech.load.load_speech_model``
picks one from ``--model``. Nothing here imports torch at module level: frontends unpickle
``ModelInfo`` from the engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from voxwire.engine.engine_config import RunnerOptions
from voxwire.engine.outputs import Runner

if TYPE_CHECKING:
    from voxwire.prompt import VoicePrompt
    from voxwire.tts import VoxCPM
    from voxwire.voice_clip import VoiceClip

SIM_MODEL = "sim"
"""``--model sim``: no weights, steps paced by a cost model, a speech clip as output (load tests)."""


@dataclass(frozen=True)
class ModelInfo:
    """What a client is told about the model in ``ready`` messages and headers."""

    name: str
    """``public_model_name`` of its ``--model`` source."""
    sample_rate: int
    samples_per_patch: int
    reference_cloning: bool
    """Whether a voice can be made from a clip without its transcript (``ModelConfig.reference_cloning``)."""
    voice_design: bool
    """Whether ``instructions`` design the voice (``ModelConfig.voice_design``)."""

    @property
    def chunk_seconds(self) -> float:
        return self.samples_per_patch / self.sample_rate


def public_model_name(source: str) -> str:
    """How clients see a ``--model`` source: a hub id (or a relative path) as given; a folder given by an absolute,
    home- or dot-relative path by its own name only, so no server path (its home, a cache folder) reaches them."""
    if source.startswith(("/", "~", ".")) or Path(source).is_absolute():
        return Path(source).name or source
    return source


class SpeechModel(Protocol):
    @property
    def info(self) -> ModelInfo: ...

    @property
    def patch_shape(self) -> tuple[int, int]:
        """(patch_size, feat_dim) of a voice's latent patches (the voice store checks saved voices by it)."""
        ...

    def make_prompt(self, clip: VoiceClip) -> VoicePrompt:
        """Encode a voice clip (blocking: the caller runs it off the event loop)."""
        ...

    def new_runner(self, options: RunnerOptions) -> Runner:
        """The engine's runner, sized by ``options`` (sessions, positions, memory)."""
        ...


class VoxCPMSpeech:
    """A loaded checkpoint as a ``SpeechModel``: ``ModelRunner`` steps, the VAE encodes voices."""

    def __init__(self, tts: VoxCPM) -> None:
        self.tts = tts
        info = (tts.sample_rate, tts.samples_per_patch, tts.config.reference_cloning, tts.config.voice_design)
        self.info = ModelInfo(public_model_name(tts.name), *info)
        self.patch_shape = (tts.config.patch_size, tts.config.feat_dim)
        self.make_prompt = tts.make_prompt

    def new_runner(self, options: RunnerOptions) -> Runner:
        from voxwire.engine.runner import ModelRunner

        return ModelRunner(self.tts, options)
