"""Benchmark (not a test): what batch-invariant numerics (``voxwire serve --batch-invariant``) cost per decode
step, on the CPU.

    python scripts/bench_batch_invariant.py [--config voxcpm2] [--batches 1,8,24] [--rounds 20] [--threads 1]

For each batch size two ``ModelRunner``s on the same model, one with the default numerics and one with
``batch_invariant=True``, prefill the same ``--batches`` sessions; then their decode steps (CFM with 10 timesteps
and CFG, both LM steps, LocEnc and the streaming VAE: the runner's whole step) are timed in turns, every
setting once per round (so the machine's load hits them alike), and the medians are reported.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

import voxwire
from voxwire.engine import Request, RunnerOptions, SynthesisParams
from voxwire.engine.outputs import PrefillItem, StepPlan
from voxwire.engine.runner import ModelRunner
from voxwire.tiny.checkpoint import make_tiny_checkpoint
from voxwire.tts import VoxCPM

TEXT = "The quick brown fox jumps over the lazy dog near the river bank"


def prefilled(tts: VoxCPM, batch: int, steps: int, invariant: bool) -> tuple[ModelRunner, StepPlan]:
    """A runner holding ``batch`` prefilled sessions that may each decode ``steps`` more patches, and the plan
    of one decode step of all of them."""
    runner = ModelRunner(tts, RunnerOptions(num_slots=batch, max_length=256, batch_invariant=invariant))
    blocks = iter(range(1, runner.num_kv_blocks))
    items = []
    for slot in range(batch):
        params = SynthesisParams(seed=slot, min_len=steps, max_len=steps, inference_timesteps=10)
        request = Request(f"r{slot}", f"{TEXT}, {slot}.", params)
        prepared = runner.prepare(request)
        need = -(-prepared.kv_positions // runner.block_size)
        items.append(PrefillItem(request.request_id, slot, request, prepared, tuple(next(blocks) for _ in range(need))))
    ids = tuple(item.request_id for item in items)
    decode = StepPlan(request_ids=ids, step_indices=(0,) * batch, decode_slots=tuple(range(batch)))
    runner.execute(
        StepPlan(prefills=tuple(items), request_ids=ids, step_indices=(0,) * batch, decode_slots=decode.decode_slots)
    )
    return runner, decode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="voxcpm2", help="tiny model shape (voxwire.tiny.configs)")
    parser.add_argument("--batches", default="1,8,24", help="comma-separated batch sizes")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    batches = [int(b) for b in args.batches.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        tts = voxwire.load_model(make_tiny_checkpoint(Path(tmp) / "model", args.config, seed=0), device="cpu")
    settings = {
        (batch, invariant): prefilled(tts, batch, args.rounds + 3, invariant)
        for batch in batches
        for invariant in (False, True)
    }
    times: dict[tuple[int, bool], list[float]] = {key: [] for key in settings}
    for runner, plan in settings.values():
        runner.execute(plan)  # warm-up
    for _ in range(args.rounds):
        for key, (runner, plan) in settings.items():
            start = time.perf_counter()
            runner.execute(plan)
            times[key].append(time.perf_counter() - start)
    print(f"{args.config} (random weights), CPU {tts.dtype}, {args.threads} thread(s), medians of {args.rounds} steps")
    print("| batch | default (ms) | batch-invariant (ms) | invariant / default |")
    print("|---|---|---|---|")
    for batch in batches:
        default, invariant = (statistics.median(times[batch, mode]) for mode in (False, True))
        print(f"| {batch} | {default * 1000:.1f} | {invariant * 1000:.1f} | {invariant / default:.2f} |")


if __name__ == "__main__":
    main()
