"""Error of fp8 (e4m3) DiT GEMMs against the bfloat16 DiT, beside the bfloat16 DiT's own error against float32.

    python scripts/dit_fp8_error.py --config voxcpm2-shape --utterances 8 --patches 4 [--json out.json]

A random checkpoint of the config's shapes (``random_model_weights``, the VAE's ``random_published_state_dict``) is
loaded on CPU as the server loads it (bf16 transformers, fused projections, the float32 VAE); ``--utterances``
texts, each with its own noise seed, are prefilled together and decoded ``--patches`` steps with the default
settings. At every step the CFM sampler (LocDiT and its guidance, all timesteps) runs three times on the same
inputs (the LM states, the previous patch, the step's noise):

* **bf16**: the DiT as served today;
* **fp8**: a copy whose decoder GEMMs (q/k/v, o_proj, gate/up, down_proj of every layer) run ``ops.fp8_linear``
  (weights per output channel, inputs per row, in float8_e4m3fn) as the CPU emulates ``torch._scaled_mm``:
  quantize with the scales, products summed in fp32, scaled, rounded once to bf16;
* **fp32**: a float32 copy of the bf16 weights, inputs and time grid (a float32 DiT).

The bf16 patch drives the LMs (so the three see the same inputs at every step); each variant's patches are decoded
by the float32 VAE on a stream of its own, as the engine streams them. Reported: each comparison's latent and audio
signal-to-error ratio over all utterances (fp8 against bf16: what the option costs; bf16 against fp32: the error the
served model already carries), and the worst utterance's audio ratio.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from voxwire.loader import model_from_weights
from voxwire.model.audio_vae import StreamingVAEDecoder, fold_weight_norm, random_published_state_dict
from voxwire.model.cfm import CfmSchedule, UnifiedCFM
from voxwire.model.kv_cache import KVCache
from voxwire.model.voxcpm import PrefillBatch
from voxwire.model_config import ModelConfig
from voxwire.params import SynthesisParams
from voxwire.sampling import NoiseStream
from voxwire.sequence import build_sequence
from voxwire.text.tokenizer import TextTokenizer
from voxwire.tiny.checkpoint import random_model_weights
from voxwire.tiny.configs import ALL_CONFIGS
from voxwire.tiny.tokenizer_files import write_tiny_tokenizer

TEXTS = (
    "Hello there, how are you today?",
    "The quick brown fox jumps over the lazy dog.",
    "Streaming speech should start quickly.",
    "One, two, three, four, five.",
    "A short sentence.",
    "Please hold while we connect your call.",
    "The weather is calm and the sea is grey.",
    "Numbers like 42 and 1999 are read aloud.",
)


@dataclass(frozen=True)
class Comparison:
    """One variant against its reference, over every utterance's patches."""

    name: str
    latent_snr_db: float
    audio_snr_db: float
    worst_utterance_audio_snr_db: float
    max_abs_audio_error: float


def snr_db(signal: torch.Tensor, error: torch.Tensor) -> float:
    return 10 * math.log10(signal.pow(2).mean().item() / max(error.pow(2).mean().item(), 1e-30))


def compare(
    name: str, approx: torch.Tensor, exact: torch.Tensor, audio: torch.Tensor, exact_audio: torch.Tensor
) -> Comparison:
    """approx/exact (U, steps, D, P) latents, audio/exact_audio (U, samples)."""
    worst = min(snr_db(exact_audio[row], audio[row] - exact_audio[row]) for row in range(audio.size(0)))
    return Comparison(
        name,
        snr_db(exact.float(), approx.float() - exact.float()),
        snr_db(exact_audio, audio - exact_audio),
        worst,
        (audio - exact_audio).abs().max().item(),
    )


def tiny_tokenizer() -> TextTokenizer:
    with tempfile.TemporaryDirectory() as folder:
        write_tiny_tokenizer(Path(folder))
        return TextTokenizer.from_dir(folder)


@torch.inference_mode()
def measure(config_name: str, utterances: int, patches: int, seed: int) -> dict[str, object]:
    config = ModelConfig.from_dict(ALL_CONFIGS[config_name], source=config_name)
    tokenizer = tiny_tokenizer()
    main = {key: value.to(torch.bfloat16) for key, value in random_model_weights(config, seed).items()}
    vae = fold_weight_norm(random_published_state_dict(config.audio_vae_config, config.vae_variant, seed))
    tts = model_from_weights(config, tokenizer, main, vae, device="cpu", dtype=torch.bfloat16, vae_dtype=torch.float32)
    del main, vae
    model, cpu, dtype = tts.model, torch.device("cpu"), torch.bfloat16
    fp8 = copy.deepcopy(model.feat_decoder)
    fp8.estimator.decoder.quantize_fp8()
    fp32: UnifiedCFM = copy.deepcopy(model.feat_decoder).float()
    params = SynthesisParams()
    sequences = [build_sequence(tokenizer, config, TEXTS[row % len(TEXTS)], None) for row in range(utterances)]
    longest = max(sequence.length for sequence in sequences) + patches + 1
    base, residual = (
        KVCache.dedicated(lm, utterances, longest, cpu, dtype) for lm in (config.lm_config, config.residual_lm)
    )
    state = model.prefill(PrefillBatch.from_sequences(sequences, cpu, dtype), base, residual)
    streams = [NoiseStream(seed + row, config.feat_dim, config.patch_size, dtype, cpu) for row in range(utterances)]
    schedule = CfmSchedule.build([params.inference_timesteps] * utterances, dtype, cpu)
    schedule32 = CfmSchedule.build([params.inference_timesteps] * utterances, torch.float32, cpu)
    cfg = torch.full((utterances,), params.cfg_value, dtype=torch.float32)
    decoder = StreamingVAEDecoder(model.audio_vae)
    names = ("bf16", "fp8", "fp32")
    vae_states = {name: decoder.new_state(utterances) for name in names}
    latents: dict[str, list[torch.Tensor]] = {name: [] for name in names}
    audio: dict[str, list[torch.Tensor]] = {name: [] for name in names}
    for _ in range(patches):
        noise = torch.stack([stream.next()[0] for stream in streams])  # (U, D, P)
        mu, cond = model.dit_condition(state), state.cond.transpose(1, 2)
        made = {
            "bf16": model.feat_decoder(noise, mu, cond, cfg, schedule),
            "fp8": fp8(noise, mu, cond, cfg, schedule),
            "fp32": fp32(noise.float(), mu.float(), cond.float(), cfg, schedule32),
        }
        for name, patch in made.items():  # (U, D, P)
            latents[name].append(patch.float())
            audio[name].append(decoder.decode(patch.float(), vae_states[name]))
        model.advance(state, made["bf16"].transpose(1, 2), base, residual)
    stacked = {name: torch.stack(latents[name], dim=1) for name in names}
    sound = {name: torch.cat(audio[name], dim=-1) for name in names}
    comparisons = [
        compare("fp8 DiT GEMMs against bf16", stacked["fp8"], stacked["bf16"], sound["fp8"], sound["bf16"]),
        compare("bf16 DiT against fp32", stacked["bf16"], stacked["fp32"], sound["bf16"], sound["fp32"]),
    ]
    return {
        "config": config_name,
        "utterances": utterances,
        "patches": patches,
        "seed": seed,
        "audio_rms": sound["bf16"].pow(2).mean().sqrt().item(),
        "samples": sound["bf16"].numel(),
        "comparisons": [asdict(comparison) for comparison in comparisons],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="voxcpm2-shape", help="an ALL_CONFIGS name")
    parser.add_argument("--utterances", type=int, default=8, help="texts decoded together, each with its own seed")
    parser.add_argument("--patches", type=int, default=4, help="steps decoded per utterance")
    parser.add_argument("--seed", type=int, default=0, help="the weights' seed; utterance i's noise seed is this + i")
    parser.add_argument("--json", type=Path, help="write the results to this file")
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    result = measure(args.config, args.utterances, args.patches, args.seed)
    print(
        f"{result['config']}: {result['utterances']} utterances x {result['patches']} patches, "
        f"{result['samples']} samples, audio rms {result['audio_rms']:.4f}"
    )
    for c in result["comparisons"]:
        assert isinstance(c, dict)
        print(
            f"  {c['name']:28s} latent SNR {c['latent_snr_db']:5.1f} dB  audio SNR {c['audio_snr_db']:5.1f} dB "
            f"(worst utterance {c['worst_utterance_audio_snr_db']:5.1f} dB)  "
            f"max |audio err| {c['max_abs_audio_error']:.2e}"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
