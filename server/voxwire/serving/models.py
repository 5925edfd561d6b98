"""``load_speech_model``: the ``SpeechModel`` that ``--model`` names (the simulator, or a checkpoint)."""

from __future__ import annotations

from voxwire.engine.cost_model import StepCost
from voxwire.serving.config import ServerConfig
from voxwire.speech_model import SIM_MODEL, SpeechModel, VoxCPMSpeech


def load_speech_model(config: ServerConfig) -> SpeechModel:
    """The model ``config.engine.model`` names: ``sim``, ``demo`` (tiny random weights: noise), a folder or a hub id."""
    if config.engine.model == SIM_MODEL:
        from voxwire.sim.model import SimSpeech
        from voxwire.sim.runner import SimConfig

        return SimSpeech(SimConfig(cost=StepCost.parse(config.engine.sim_cost)))
    from voxwire.loader import load_model

    return VoxCPMSpeech(
        load_model(
            config.engine.model,
            device=config.engine.device,
            dtype=config.engine.dtype,
            vae_dtype=config.engine.vae_dtype,
        )
    )
