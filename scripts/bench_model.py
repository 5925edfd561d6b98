"""Benchmark (not a test): voxwire against the reference implementation at batch 1, on the CPU.

Run it with the reference environment's python, which has both packages importable
(``bash scripts/reference/setup_env.sh`` installs voxwire there too):

    .venv-reference/bin/python scripts/bench_model.py [--config voxcpm-0.5b-shape] [--steps 8]

Both load the same random checkpoint (published layout, release shape) in float32 with the same
thread count, in one process, and their steps are timed alternately (one reference step, one
voxwire step, ...) so that the machine's load hits both alike. Reported medians:

* decode step: one autoregressive step (CFM with 10 timesteps and CFG, LocEnc, both LM steps);
  the reference's is one iteration of its own ``_inference`` loop;
* streaming step: a decode step plus the audio of that patch, as a live stream delivers it: the
  reference's ``generate_with_prompt_cache_streaming`` step (v1: the last three patches re-decoded;
  v2: its stateful decoder) against ``VoxCPM.stream``;
* VAE per patch: only the audio decode of one patch, the same two ways.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from voxcpm.core import VoxCPM as ReferenceVoxCPM

import voxwire
from voxwire.model.cfm import CfmSchedule
from voxwire.model.kv_cache import KVCache
from voxwire.model.voxcpm import PrefillBatch
from voxwire.params import SynthesisParams
from voxwire.sampling import NoiseStream
from voxwire.sequence import build_sequence
from voxwire.tiny.checkpoint import make_tiny_checkpoint

TEXT = "The quick brown fox jumps over the lazy dog near the river bank, and then it runs home again."


def float32_reference(path: Path) -> ReferenceVoxCPM:
    """The reference model of the checkpoint at ``path``, in float32 on the CPU (it reads both from the checkpoint's
    config.json, which this rewrites) and without its denoiser or warm-up."""
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "dtype": "float32", "device": "cpu"}))
    return ReferenceVoxCPM(str(path), enable_denoiser=False, optimize=False, device="cpu")


def alternate(first: Callable[[], object], second: Callable[[], object], rounds: int) -> tuple[float, float]:
    """Median seconds of ``first`` and ``second``, called alternately ``rounds`` times after one warm-up each."""
    first(), second()
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(rounds):
        for call, sink in ((first, times[0]), (second, times[1])):
            start = time.perf_counter()
            call()
            sink.append(time.perf_counter() - start)
    return statistics.median(times[0]), statistics.median(times[1])


def reference_decode_steps(ref: ReferenceVoxCPM, steps: int) -> Iterator[object]:
    """The reference's own loop, one yield per step, before any audio decode (zero-shot layout)."""
    model = ref.tts_model
    tokens = torch.LongTensor([*model.text_tokenizer(TEXT), model.audio_start_token]).unsqueeze(0)
    length = tokens.shape[1]
    feats = torch.zeros(1, length, model.patch_size, model.audio_vae.latent_dim)
    text_mask, audio_mask = torch.ones(1, length, dtype=torch.int32), torch.zeros(1, length, dtype=torch.int32)
    return model._inference(tokens, text_mask, feats, audio_mask, min_len=steps, max_len=steps, streaming=True)


def voxwire_decode_steps(tts: voxwire.tts.VoxCPM, steps: int) -> Iterator[object]:
    config, model = tts.config, tts.model
    sequence = build_sequence(tts.tokenizer, config, TEXT, None)
    caches = [
        KVCache.dedicated(lm, 1, sequence.length + steps, tts.device, tts.dtype)
        for lm in (config.lm_config, config.residual_lm)
    ]
    state = model.prefill(PrefillBatch.from_sequences([sequence], tts.device, tts.dtype), *caches)
    noise = NoiseStream(0, config.feat_dim, config.patch_size, tts.dtype, tts.device)
    schedule = CfmSchedule.build([10], tts.dtype, tts.device)
    cfg = torch.tensor([2.0])
    for _ in range(steps):
        _, stop = model.decode_step(state, *caches, noise.next(), cfg, schedule)
        yield bool(stop.argmax(-1)[0] == 1)  # the one host read per step


@torch.inference_mode()
def measure(ref: ReferenceVoxCPM, tts: voxwire.tts.VoxCPM, steps: int) -> dict[str, tuple[float, float]]:
    results = {}
    ref_steps, our_steps = reference_decode_steps(ref, steps + 2), voxwire_decode_steps(tts, steps + 2)
    next(ref_steps), next(our_steps)  # the first step carries the prefill
    results["decode step"] = alternate(lambda: next(ref_steps), lambda: next(our_steps), steps)
    ref_stream = ref.tts_model.generate_with_prompt_cache_streaming(TEXT, None, min_len=steps + 2, max_len=steps + 2)
    our_stream = tts.stream(TEXT, SynthesisParams(seed=0, min_len=steps + 2, max_len=steps + 2))
    next(ref_stream), next(our_stream)
    results["streaming step (with audio)"] = alternate(lambda: next(ref_stream), lambda: next(our_stream), steps)
    vae, patch = ref.tts_model.audio_vae, tts.config.patch_size
    window = torch.randn(1, vae.latent_dim, 3 * patch)
    state = tts.vae_decoder.new_state(1)
    latent = torch.randn(1, vae.latent_dim, patch)
    if tts.config.architecture == "voxcpm":

        def reference_vae() -> object:
            return vae.decode(window)[..., -patch * vae.chunk_size :]
    else:
        decoder = vae.streaming_decode().__enter__()

        def reference_vae() -> object:
            return decoder.decode_chunk(latent)

    results["VAE decode per patch"] = alternate(reference_vae, lambda: tts.vae_decoder.decode(latent, state), steps)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description="voxwire vs the reference at batch 1 on CPU")
    parser.add_argument("--config", default="voxcpm-0.5b-shape", help="a voxwire.tiny.configs.ALL_CONFIGS name")
    parser.add_argument("--steps", type=int, default=8, help="timed steps per measure (medians are reported)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        path = make_tiny_checkpoint(Path(tmp) / args.config, args.config)
        ref = float32_reference(path)
        tts = voxwire.load_model(path, device="cpu", dtype="float32")
        results = measure(ref, tts, args.steps)
    print(
        f"\nconfig {args.config}, CPU float32, {args.threads} threads, batch 1, medians of {args.steps} "
        "alternating steps"
    )
    print("| measure | reference (ms) | voxwire (ms) | reference / voxwire |\n|---|---|---|---|")
    for label, (reference, ours) in results.items():
        print(f"| {label} | {reference * 1e3:.1f} | {ours * 1e3:.1f} | {reference / ours:.2f} |")


if __name__ == "__main__":
    main()
