"""Error of the AudioVAE decoder in bfloat16 (or float16) against float32, on the streaming path the engine runs.

    python scripts/vae_bf16_error.py --config voxcpm2-shape --patches 2 [--dtype float16] [--json out.json]

Random published-layout VAE weights (``random_published_state_dict``: scaled so the decoder's output is
neither silent nor saturated) and N(0, 1) latents; the same latents are decoded patch by patch with
float32 and with half-precision weights, activations and stream state (the CPU computes half ops in
float32 and rounds each result, as CUDA does; Snake runs unfused here, rounding five times where the
CUDA kernel rounds once, which costs under 1 dB of the ratio below). Reports the largest sample error (audio is in
[-1, 1]) and the signal-to-error ratio.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import torch

from voxwire.model.audio_vae import AudioVAE, decode_error, fold_weight_norm, random_published_state_dict
from voxwire.model_config import ModelConfig
from voxwire.tiny.configs import ALL_CONFIGS


@torch.no_grad()
def measure(config_name: str, patches: int, batch: int, seed: int, dtype: torch.dtype) -> dict[str, float | int | str]:
    config = ModelConfig.from_dict(ALL_CONFIGS[config_name], source=config_name)
    vae = AudioVAE(config.audio_vae_config, config.vae_variant)
    weights = random_published_state_dict(config.audio_vae_config, config.vae_variant, seed)
    vae.load_state_dict(fold_weight_norm(weights))
    generator = torch.Generator().manual_seed(seed)
    latents = torch.randn(batch, config.feat_dim, patches * config.patch_size, generator=generator)
    measured = decode_error(vae.eval(), dtype, latents, config.patch_size)
    return {"config": config_name, "dtype": str(dtype).removeprefix("torch."), **dataclasses.asdict(measured)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="voxcpm2-shape", help="comma-separated ALL_CONFIGS names")
    parser.add_argument("--patches", type=int, default=6, help="patches decoded per stream")
    parser.add_argument("--batch", type=int, default=2, help="streams decoded together")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", choices=("bfloat16", "float16"), default="bfloat16", help="the reduced precision")
    parser.add_argument("--json", type=Path, help="write the results to this file")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    results = [measure(name, args.patches, args.batch, args.seed, dtype) for name in args.config.split(",")]
    for r in results:
        print(
            f"{r['config']:18s} {r['dtype']:8s} samples {r['samples']:7d}  signal rms {r['signal_rms']:.4f}  "
            f"max |err| {r['max_abs_error']:.2e}  rms err {r['rms_error']:.2e}  SNR {r['snr_db']:.1f} dB"
        )
    if args.json is not None:
        args.json.write_text(json.dumps({"results": results}, indent=1))


if __name__ == "__main__":
    main()
