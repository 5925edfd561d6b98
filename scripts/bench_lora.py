"""Benchmark (not a test): what LoRA personas cost per decode step, on the CPU.

    python scripts/bench_lora.py [--config voxcpm2] [--batch 8] [--rounds 20]

One batch of ``--batch`` rows is prefilled once; then one decode step (CFM with 10 timesteps and CFG,
LocEnc, both LM steps) is timed in each setting, the settings taking turns (so the machine's load hits
them alike), and the median is reported:

* no personas: the plain model (no adapted layers);
* personas enabled, 0 in the batch: adapted layers present, every row on slot 0 (no adapter);
* 1 persona: every row on the same adapter;
* 4 personas: rows spread over four adapters.

The adapters are random, r=8, on the LM's and LocDiT's attention and on every projection (the shape of the
reference-made fixture ``tests/fixtures/reference/lora/voxcpm2``). Steps run from the same saved state each
time, so every setting does the same work.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import save_file

import voxwire
from voxwire.model.cfm import CfmSchedule
from voxwire.model.kv_cache import KVCache
from voxwire.model.lora import target_layers
from voxwire.model.voxcpm import DecodeState, PrefillBatch
from voxwire.sequence import build_sequence
from voxwire.tiny.checkpoint import make_tiny_checkpoint
from voxwire.tts import VoxCPM

TEXT = "The quick brown fox jumps over the lazy dog near the river bank."
LORA_CONFIG = {
    "enable_lm": True,
    "enable_dit": True,
    "enable_proj": True,
    "r": 8,
    "alpha": 16,
    "target_modules_lm": ["q_proj", "k_proj", "v_proj", "o_proj"],
    "target_modules_dit": ["q_proj", "k_proj", "v_proj", "o_proj"],
}


def write_adapter(tts: VoxCPM, folder: Path, seed: int) -> Path:
    """A random adapter in the reference's format for every layer ``LORA_CONFIG`` targets."""
    from voxwire.model.lora import LoRAConfig

    config = LoRAConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in LORA_CONFIG.items()})
    generator = torch.Generator().manual_seed(seed)
    state = {}
    for path, linear in target_layers(tts.model, config).items():
        state[f"{path}.lora_A"] = torch.randn(8, linear.in_features, generator=generator) / linear.in_features**0.5
        state[f"{path}.lora_B"] = torch.randn(linear.out_features, 8, generator=generator) * 0.05
    folder.mkdir(parents=True)
    save_file(state, str(folder / "lora_weights.safetensors"))
    (folder / "lora_config.json").write_text(json.dumps({"base_model": "bench", "lora_config": LORA_CONFIG}))
    return folder


class Step:
    """One decode step of a prefilled batch, restarted from the same state every call."""

    def __init__(self, tts: VoxCPM, batch: int) -> None:
        self.tts = tts
        config, device, dtype = tts.config, tts.device, tts.dtype
        sequence = build_sequence(tts.tokenizer, config, TEXT, None)
        self.rows = [
            KVCache.dedicated(lm, batch, sequence.length + 8, device, dtype)
            for lm in (config.lm_config, config.residual_lm)
        ]
        with torch.inference_mode():
            batch_inputs = PrefillBatch.from_sequences([sequence] * batch, device, dtype)
            self.saved = tts.model.prefill(batch_inputs, *self.rows)
            self.state = DecodeState(*(t.clone() for t in self.saved.as_tuple()))
        self.noise = torch.randn(batch, config.feat_dim, config.patch_size, generator=torch.Generator().manual_seed(0))
        self.cfg = torch.full((batch,), 2.0)
        self.schedule = CfmSchedule.build([10] * batch, dtype, device)

    @torch.inference_mode()
    def __call__(self, index: torch.Tensor | None) -> None:
        if self.tts.personas is not None:
            self.tts.personas.rows.index = index
        self.state.copy_(self.saved)
        self.tts.model.decode_step(self.state, *self.rows, self.noise.to(self.tts.dtype), self.cfg, self.schedule)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="voxcpm2", help="tiny model shape (voxwire.tiny.configs)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        folder = make_tiny_checkpoint(Path(tmp) / "model", args.config, seed=0)
        plain = voxwire.load_model(folder, device="cpu", dtype=torch.float32)
        adapted = voxwire.load_model(folder, device="cpu", dtype=torch.float32)
        adapted.enable_personas(max_personas=4, max_rank=8)
        for k in range(4):
            adapted.load_persona(f"p{k}", write_adapter(adapted, Path(tmp) / f"p{k}", seed=k))
        slots = [adapted.personas.acquire(f"p{k}") for k in range(4)]  # type: ignore[union-attr]
        batch = args.batch
        settings: dict[str, Callable[[], None]] = {}
        plain_step, adapted_step = Step(plain, batch), Step(adapted, batch)
        settings["no personas"] = lambda: plain_step(None)
        zero, one = torch.zeros(batch, dtype=torch.long), torch.full((batch,), slots[0])
        four = torch.tensor([slots[i % 4] for i in range(batch)])
        settings["personas enabled, 0 in the batch"] = lambda: adapted_step(zero)
        settings["1 persona"] = lambda: adapted_step(one)
        settings["4 personas"] = lambda: adapted_step(four)
        times: dict[str, list[float]] = {name: [] for name in settings}
        for call in settings.values():
            call()  # warm-up
        for _ in range(args.rounds):
            for name, call in settings.items():
                start = time.perf_counter()
                call()
                times[name].append(time.perf_counter() - start)
    base = statistics.median(times["no personas"])
    print(f"{args.config}, batch {batch}, CPU float32, {args.threads} threads, median of {args.rounds} steps")
    print("| setting | decode step (ms) | vs no personas |")
    print("|---|---|---|")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"| {name} | {median * 1000:.1f} | {median / base:.2f}x |")


if __name__ == "__main__":
    main()
