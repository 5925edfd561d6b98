"""Golden AudioVAE fixtures from the reference implementation (PyPI voxcpm 2.0.3).

For each tiny VAE layout (V1 16 kHz, V1 44.1 kHz, V2 16→48 kHz) this loads random weights in the
published ``weight_g``/``weight_v`` layout into the *reference* ``AudioVAE`` with
``load_state_dict(strict=True)`` (which checks voxwire's key layout), runs the reference ``encode``
on a fixed clip and ``decode`` on fixed latents, and writes inputs, weights and reference outputs to
``tests/fixtures/reference/vae/<name>.safetensors``. voxwire is imported only for the tiny configs
and to draw the random weights; every expected value is computed by the reference.

    usage: <reference venv>/bin/python scripts/reference/vae_fixtures.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "server"))

from voxcpm.modules.audiovae import audio_vae as reference_v1  # noqa: E402
from voxcpm.modules.audiovae import audio_vae_v2 as reference_v2  # noqa: E402

from voxwire.model.audio_vae import random_published_state_dict  # noqa: E402
from voxwire.model_config import ModelConfig  # noqa: E402
from voxwire.tiny.configs import TINY_CONFIGS  # noqa: E402

OUT_DIR = ROOT / "tests" / "fixtures" / "reference" / "vae"
NAMES = ("voxcpm-16k", "voxcpm-44k", "voxcpm2")
WEIGHT_SEED = 1234
BATCH = 2
ENCODE_HOPS = 3.4  # a clip that is not a whole number of hops exercises the encoder's right padding
DECODE_FRAMES = 5


def reference_vae(name: str) -> torch.nn.Module:
    """The reference AudioVAE class of this layout, built from the tiny config's raw section."""
    raw = TINY_CONFIGS[name]
    module = reference_v2 if raw["architecture"] == "voxcpm2" else reference_v1
    return module.AudioVAE(module.AudioVAEConfig(**raw["audio_vae_config"]))


def chirp_clip(sample_rate: int, length: int, generator: torch.Generator) -> torch.Tensor:
    """(BATCH, length): a different chirp plus a little noise per row, peak about 0.6."""
    t = torch.arange(length, dtype=torch.float64) / sample_rate
    rows = []
    for row in range(BATCH):
        f0 = 150.0 * (row + 1)
        chirp = torch.sin(2 * torch.pi * (f0 * t + 400.0 * t * t))
        rows.append(0.5 * chirp + 0.05 * torch.randn(length, generator=generator, dtype=torch.float64))
    return torch.stack(rows).to(torch.float32)


def make_fixture(name: str) -> dict[str, torch.Tensor]:
    config = ModelConfig.from_dict(TINY_CONFIGS[name])
    vae_config = config.audio_vae_config
    weights = random_published_state_dict(vae_config, config.vae_variant, WEIGHT_SEED)
    vae = reference_vae(name)
    vae.load_state_dict(weights, strict=True)
    vae.eval()

    generator = torch.Generator().manual_seed(7)
    audio = chirp_clip(vae_config.sample_rate, int(ENCODE_HOPS * vae_config.encoder_hop), generator)
    latents = torch.randn(BATCH, vae_config.latent_dim, DECODE_FRAMES, generator=generator)
    with torch.no_grad():
        encoded = vae.encode(audio, vae_config.sample_rate)
        decoded = vae.decode(latents).squeeze(1)

    tensors = {"audio": audio, "latents": latents, "encoded": encoded.contiguous(), "decoded": decoded.contiguous()}
    for key, value in weights.items():
        if value.is_floating_point():
            # The random weights are bfloat16-representable by construction: storing them so is lossless.
            stored = value.to(torch.bfloat16)
            assert torch.equal(stored.to(torch.float32), value), key
            value = stored
        tensors[f"weights.{key}"] = value
    return tensors


def main() -> None:
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    for name in NAMES:
        tensors = make_fixture(name)
        metadata = {
            "config": name,
            "weight_seed": str(WEIGHT_SEED),
            "reference": "voxcpm 2.0.3",
            "torch": torch.__version__,
        }
        path = OUT_DIR / f"{name}.safetensors"
        save_file(tensors, str(path), metadata=metadata)
        print(f"{path.relative_to(ROOT)}: {path.stat().st_size} bytes")


if __name__ == "__main__":
    main()
