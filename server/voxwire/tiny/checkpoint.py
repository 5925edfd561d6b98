"""Writes a small random VoxCPM checkpoint in the exact published file layout.

``config.json``; ``model.safetensors`` (bf16, as VoxCPM1.5 and VoxCPM2 ship) or ``pytorch_model.bin``
(as VoxCPM-0.5B ships); ``audiovae.pth`` as ``{"state_dict": ...}`` with weight-norm ``weight_g`` /
``weight_v`` pairs in fp32; Llama-style tokenizer files. Deterministic from the seed, so tests,
fixtures and benchmarks can regenerate the same model anywhere.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from voxwire.model.audio_vae import random_published_state_dict
from voxwire.model.voxcpm import VoxCPMModel
from voxwire.model_config import ModelConfig
from voxwire.tiny.configs import ALL_CONFIGS
from voxwire.tiny.tokenizer_files import write_tiny_tokenizer

DEFAULT_FOR_ARCHITECTURE = {"voxcpm": "voxcpm-44k", "voxcpm2": "voxcpm2"}
# VoxCPM-0.5B ships pytorch_model.bin; the later releases ship model.safetensors.
_PICKLED_WEIGHTS = {"voxcpm-16k", "voxcpm-0.5b-shape"}


def make_tiny_checkpoint(directory: str | Path, name: str = "voxcpm2", seed: int = 0) -> Path:
    """Write tiny model ``name`` (a key of ``ALL_CONFIGS``) into ``directory`` and return its path."""
    if name not in ALL_CONFIGS:
        raise ValueError(f"unknown tiny model {name!r}; choose one of {', '.join(ALL_CONFIGS)}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    raw = ALL_CONFIGS[name]
    config = ModelConfig.from_dict(raw, source=name)
    (directory / "config.json").write_text(json.dumps(raw, indent=2) + "\n", encoding="utf-8")
    weights = {k: v.to(torch.bfloat16).contiguous() for k, v in random_model_weights(config, seed).items()}
    if name in _PICKLED_WEIGHTS:
        torch.save(weights, directory / "pytorch_model.bin")
    else:
        save_file(weights, str(directory / "model.safetensors"))
    vae = random_published_state_dict(config.audio_vae_config, config.vae_variant, seed)
    torch.save({"state_dict": vae}, directory / "audiovae.pth")
    write_tiny_tokenizer(directory)
    return directory


def random_model_weights(config: ModelConfig, seed: int) -> dict[str, torch.Tensor]:
    """Random main-file weights (everything but the AudioVAE), scaled so activations stay O(1)."""
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in VoxCPMModel(config).state_dict().items() if not k.startswith("audio_vae.")}
    generator = torch.Generator().manual_seed(seed)
    weights = {}
    for key, shape in shapes.items():
        noise = torch.randn(shape, generator=generator)
        if key.endswith("norm.weight"):
            weights[key] = 1.0 + 0.1 * noise
        elif key.endswith("bias") or key.endswith("special_token"):
            weights[key] = 0.1 * noise
        elif key.endswith("embed_tokens.weight"):
            weights[key] = noise
        else:
            weights[key] = noise / math.sqrt(shape[-1])
    return weights


def weights_digest(directory: str | Path) -> str:
    """SHA-256 over every tensor (name, dtype, shape, bytes) of a checkpoint's weight files, independent of
    how the files were serialised; fixtures record it so a changed generator cannot go unnoticed."""
    directory = Path(directory)
    digest = hashlib.sha256()
    for name in ("model.safetensors", "pytorch_model.bin", "audiovae.pth"):
        path = directory / name
        if not path.is_file():
            continue
        state = load_file(str(path)) if path.suffix == ".safetensors" else torch.load(path, weights_only=True)
        state = state.get("state_dict", state)
        for key in sorted(state):
            tensor = state[key].contiguous()
            digest.update(f"{name}:{key}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
            digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()


DEMO_MODEL = "voxcpm2"


def demo_checkpoint(cache_dir: str | Path | None = None) -> Path:
    """The ``demo`` model: a tiny random voxcpm2 checkpoint made once in the cache folder (its audio is noise,
    but every code path runs with no download). ``VOXWIRE_CACHE`` overrides ``~/.cache/voxwire``."""
    root = Path(cache_dir or os.environ.get("VOXWIRE_CACHE") or Path.home() / ".cache" / "voxwire")
    directory = root / f"demo-{DEMO_MODEL}"
    if not (directory / "tokenizer.json").is_file():
        # Written beside and renamed, so a crash mid-way never leaves a half checkpoint behind.
        partial = root / f".demo-{DEMO_MODEL}-{os.getpid()}"
        make_tiny_checkpoint(partial, DEMO_MODEL)
        if directory.exists():
            shutil.rmtree(directory)
        partial.rename(directory)
    return directory
