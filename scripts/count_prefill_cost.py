"""Count (not time) what one prefill costs, on the meta device: matmul and attention FLOPs of a prefill as
it was (LocEnc over every position), as it is (LocEnc over the audio positions only) and with the voice's
encoding from the runner's voice cache (no LocEnc at all).

    python scripts/count_prefill_cost.py [--config voxcpm2-shape] [--prompt-seconds 10] [--json out.json]

The request is a typical cloned-voice utterance: a continuation voice (a clip of ``--prompt-seconds`` and
its transcript) and one sentence of target text, plus the same sentence zero-shot. Text is tokenized with
the tiny test tokenizer, so token counts differ a little from a release tokenizer's; the counts per
position do not. Nothing is computed: the model lives on the meta device.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

from voxwire.model.kv_cache import KVCache
from voxwire.model.voxcpm import PrefillBatch, VoxCPMModel
from voxwire.model_config import ModelConfig
from voxwire.prompt import VoicePrompt
from voxwire.sequence import InputSequence, build_sequence
from voxwire.text.tokenizer import TextTokenizer
from voxwire.tiny.configs import ALL_CONFIGS
from voxwire.tiny.tokenizer_files import write_tiny_tokenizer

TRANSCRIPT = "This is the speaker reading a short passage so that the model can learn how the voice sounds."
TARGET = "The quick brown fox jumps over the lazy dog near the river bank."
META = torch.device("meta")


def flops(work: Callable[[], object]) -> int:
    with FlopCounterMode(display=False) as counter:
        work()
    return counter.get_total_flops()


def prefill_flops(model: VoxCPMModel, config: ModelConfig, batch: PrefillBatch) -> int:
    lms = (config.lm_config, config.residual_lm)
    caches = [KVCache.dedicated(lm, 1, config.max_length, META, torch.bfloat16) for lm in lms]
    return flops(lambda: model.prefill(batch, *caches))


def costs(model: VoxCPMModel, config: ModelConfig, sequence: InputSequence) -> dict[str, float]:
    batch = PrefillBatch.from_sequences([sequence], META, torch.bfloat16)
    # Before: LocEnc ran on every position (text positions' results were then multiplied by 0).
    every_position = dataclasses.replace(batch, audio_positions=torch.arange(sequence.length, device=META))
    before = prefill_flops(model, config, every_position)
    audio_positions = int(batch.audio_positions.numel())
    if audio_positions:
        # The engine's way: the voice's patches encoded by themselves (or taken from the voice cache).
        patches = torch.zeros(audio_positions, config.patch_size, config.feat_dim, device=META, dtype=torch.bfloat16)
        encoding = flops(lambda: model.encode_patches(patches))
        encodings = torch.zeros(audio_positions, config.encoder_config.hidden_dim, device=META, dtype=torch.bfloat16)
        with_cache = prefill_flops(model, config, dataclasses.replace(batch, audio_encodings=encodings))
        after = encoding + with_cache
    else:
        after = with_cache = prefill_flops(model, config, batch)
    return {
        "positions": sequence.length,
        "audio_positions": audio_positions,
        "gflop_locenc_every_position": before / 1e9,
        "gflop_locenc_audio_only": after / 1e9,
        "gflop_voice_cached": with_cache / 1e9,
        "saved_by_skipping_text": 1 - after / before,
        "saved_with_voice_cache": 1 - with_cache / before,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="voxcpm2-shape", choices=sorted(ALL_CONFIGS))
    parser.add_argument("--prompt-seconds", type=float, default=10.0, help="length of the voice's clip")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    config = ModelConfig.from_dict(ALL_CONFIGS[args.config], source=args.config)
    with torch.device(META):
        model = VoxCPMModel(config)
    model.cast_transformers(torch.bfloat16)
    with tempfile.TemporaryDirectory() as tmp:
        write_tiny_tokenizer(Path(tmp))
        tokenizer = TextTokenizer.from_dir(tmp)
    patches = round(args.prompt_seconds * config.sample_rate / config.samples_per_patch)
    voice = VoicePrompt(TRANSCRIPT, torch.zeros(patches, config.patch_size, config.feat_dim))
    rows = []
    for name, prompt in (("cloned voice", voice), ("zero-shot", None)):
        row = {"request": name, **costs(model, config, build_sequence(tokenizer, config, TARGET, prompt))}
        rows.append(row)
        print(
            f"{name:>12}: {row['positions']} positions ({row['audio_positions']} audio); GFLOP "
            f"{row['gflop_locenc_every_position']:.1f} (LocEnc on every position) -> "
            f"{row['gflop_locenc_audio_only']:.1f} (audio positions only, -{row['saved_by_skipping_text']:.0%}) -> "
            f"{row['gflop_voice_cached']:.1f} (voice cached, -{row['saved_with_voice_cache']:.0%})"
        )
    if args.json:
        args.json.write_text(json.dumps({"config": args.config, "rows": rows}, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
