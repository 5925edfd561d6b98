"""``load_speech_model``: the ``SpeechModel`` that ``--model`` names (the simulator, or a checkpoint)."""

from __future__ import annotations

from voxwire.engine.cost_model import StepCost
from voxwire.serving.server_config import DIT_FP8_CHOICES, ServerConfig
from voxwire.speech_model import SIM_MODEL, SpeechModel, VoxCPMSpeech
from voxwire.startup import Readiness, enter


def load_speech_model(config: ServerConfig) -> SpeechModel:
    """The model ``config.engine.model`` names: ``sim``, ``demo`` (tiny random weights: noise), a folder or a hub id."""
    if config.engine.model == SIM_MODEL:
        enter(Readiness.LOADING_WEIGHTS, "none: the simulator (--model sim)")
        from voxwire.sim.model import SimSpeech
        from voxwire.sim.runner import SimConfig

        return SimSpeech(SimConfig(cost=StepCost.parse(config.engine.sim_cost)))
    from voxwire.loader import load_model

    engine = config.engine
    fp8 = DIT_FP8_CHOICES[engine.dit_fp8]
    model = load_model(engine.model, device=engine.device, dtype=engine.dtype, vae_dtype=engine.vae_dtype, dit_fp8=fp8)
    return VoxCPMSpeech(model)
