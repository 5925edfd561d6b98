"""The engine over the real (tiny) model: a request as a client would send it, the engine stepped until every
request is done, the audio a request heard, a crowd of varied requests, and a voice prompt."""

from __future__ import annotations

import numpy as np
import torch

from voxwire.engine import Chunk, Engine, Request, SynthesisParams
from voxwire.prompt import VoicePrompt
from voxwire.tts import VoxCPM


def request(rid: str, text: str, **params: object) -> Request:
    return Request(rid, text, params=SynthesisParams(**params))


def run(engine: Engine, arrivals: dict[int, list[Request]], limit: int = 400) -> dict[str, list[Chunk]]:
    """Step until idle; ``arrivals[k]`` are added before step k. Returns each request's outputs."""
    outputs: dict[str, list[Chunk]] = {}
    for step in range(limit):
        for req in arrivals.get(step, []):
            engine.add(req)
        for out in engine.step():
            outputs.setdefault(out.request_id, []).append(out)
        if step >= max(arrivals, default=0) and not engine.has_work():
            return outputs
    raise AssertionError("engine did not finish")


def audio(outputs: list[Chunk]) -> np.ndarray:
    return np.concatenate([o.audio for o in outputs])


def crowd(tts: VoxCPM, count: int) -> list[Request]:
    """``count`` different utterances: texts, seeds, guidance, timestep counts, lengths and voices all vary."""
    words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo"]
    made = []
    for i in range(count):
        text = f"{words[i % 11]} {words[(5 * i + 3) % 11]}, {i}." + (" 中文句子。" if i % 4 == 1 else "")
        params = {"seed": 1000 + i, "cfg_value": 1.0 + 0.25 * (i % 7), "max_len": 6 + i % 9, "min_len": 4}
        if i % 3 == 2:
            params["inference_timesteps"] = 4 + i % 8
        made.append(request(f"s{i}", text, **params))
        if i % 5 == 3:  # a voice prompt: LocEnc in the prefill
            made[-1] = Request(made[-1].request_id, text, made[-1].params, prompt=voice(tts, seed=i))
    return made


def voice(tts: VoxCPM, seed: int, audio: int = 5, reference: int = 3) -> VoicePrompt:
    generator = torch.Generator().manual_seed(seed)
    shape = (tts.config.patch_size, tts.config.feat_dim)
    return VoicePrompt(
        "A transcript of the clip.",
        torch.randn(audio, *shape, generator=generator),
        torch.randn(reference, *shape, generator=generator),
    )
