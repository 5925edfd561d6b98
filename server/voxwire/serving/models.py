"""``load_speech_model``: the ``SpeechModel`` that ``--model`` names (the simulator, or a checkpoint)."""

from __future__ import annotations

from voxwire.engine.cost_model import StepCost
from voxwire.serving.config import ServerConfig
from voxwire.speech_model import SIM_MODEL, SpeechModel, VoxCPMSpeech


def load_speech_model(config: ServerConfig) -> SpeechModel:
    """The model ``config.model`` names: ``sim``, ``demo`` (tiny random weights: noise), a folder or a hub id."""
    if config.model == SIM_MODEL:
        from voxwire.sim.model import SimSpeech
        from voxwire.sim.runner import SimConfig

        return SimSpeech(SimConfig(cost=StepCost.parse(config.sim_cost)))
    from voxwire.loader import load_model

    return VoxCPMSpeech(load_model(config.model, device=config.device, dtype=config.dtype, vae_dtype=config.vae_dtype))
