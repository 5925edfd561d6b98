"""Benchmark (not a test): what the micro-batcher buys on CPU, and what arrivals cost running streams.

    python scripts/bench_engine.py [--config voxcpm2] [--patches 16] [--sessions 1,2,4,8,16,32]

For each concurrency c, the same c sessions (fixed length: ``--patches`` patches each, distinct
texts and seeds) run two ways, one right after the other:

* batched: one engine with c slots, all sessions admitted together, one batched step per patch;
* sequential: the same sessions one after another at batch 1 (an engine with one slot).

Throughput is generated audio seconds per wall second. Then, with ``--arrival-sessions`` streams
running, new sessions keep arriving (one every few steps) and the script reports the gap between
consecutive chunks of the running streams: the worst gap against the median step.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

import voxstream
from voxstream.engine import Engine, EngineConfig, Request, SynthesisParams
from voxstream.engine.runner import ModelRunner
from voxstream.tiny.checkpoint import make_tiny_checkpoint
from voxstream.tts import VoxCPM

TEXTS = [
    "Hello there, how are you today?",
    "The weather is lovely this afternoon.",
    "今天天气很好。",
    "Numbers like 3.14 are read aloud.",
    "A short one.",
    "Streaming speech, one patch at a time.",
]


def sessions(count: int, patches: int, offset: int = 0) -> list[Request]:
    params = [SynthesisParams(seed=offset + i, min_len=patches, max_len=patches) for i in range(count)]
    return [Request(f"s{offset + i}", TEXTS[(offset + i) % len(TEXTS)], 12, p) for i, p in enumerate(params)]


def run_all(tts: VoxCPM, requests: list[Request], slots: int) -> float:
    """Wall seconds to finish every request on an engine with ``slots`` rows."""
    engine = Engine(
        ModelRunner(tts, num_slots=slots, max_length=256), EngineConfig(max_running=slots, max_waiting=len(requests))
    )
    start = time.perf_counter()
    for request in requests:
        engine.add(request)
    while engine.has_work():
        engine.step()
    return time.perf_counter() - start


def throughput_table(tts: VoxCPM, counts: list[int], patches: int) -> None:
    seconds_per_patch = tts.samples_per_patch / tts.sample_rate
    run_all(tts, sessions(2, 2), slots=2)  # warm-up: first-call allocations and caches
    print("| sessions | batched audio s / wall s | sequential audio s / wall s | batched / sequential |")
    print("|---|---|---|---|")
    for count in counts:
        audio = count * patches * seconds_per_patch
        batched = audio / run_all(tts, sessions(count, patches), slots=count)
        sequential = audio / run_all(tts, sessions(count, patches), slots=1)
        print(f"| {count} | {batched:.2f} | {sequential:.2f} | {batched / sequential:.2f} |", flush=True)


def arrival_gaps(tts: VoxCPM, running: int, patches: int, arrivals: int) -> None:
    """Keep ``running`` long streams going while ``arrivals`` short sessions arrive, one every 3 steps."""
    slots = running + arrivals
    engine = Engine(ModelRunner(tts, num_slots=slots, max_length=256), EngineConfig(max_running=slots))
    for request in sessions(running, patches * 4):
        engine.add(request)
    long_ids = {f"s{i}" for i in range(running)}
    newcomers = sessions(arrivals, patches, offset=1000)
    last_chunk: dict[str, float] = {}
    gaps, steps = [], []
    step = 0
    while engine.has_work():
        if step % 3 == 0 and newcomers:
            engine.add(newcomers.pop())
        start = time.perf_counter()
        outputs = engine.step()
        now = time.perf_counter()
        steps.append(now - start)
        for out in outputs:
            if out.request_id in long_ids and out.chunk.size:
                if out.request_id in last_chunk:
                    gaps.append(now - last_chunk[out.request_id])
                last_chunk[out.request_id] = now
        step += 1
    chunk_ms = tts.samples_per_patch / tts.sample_rate * 1e3
    print(f"\n{running} running streams, {arrivals} sessions arriving one every 3 steps (prefill in the same step):")
    print(
        f"median step {statistics.median(steps) * 1e3:.1f} ms; gap between a running stream's chunks: "
        f"median {statistics.median(gaps) * 1e3:.1f} ms, worst {max(gaps) * 1e3:.1f} ms "
        f"(one chunk is {chunk_ms:.0f} ms of audio)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description="micro-batcher throughput and arrival gaps on CPU")
    parser.add_argument("--config", default="voxcpm2", help="a voxstream.tiny.configs.ALL_CONFIGS name")
    parser.add_argument("--patches", type=int, default=16, help="patches per session")
    parser.add_argument("--sessions", default="1,2,4,8,16,32", help="concurrency levels")
    parser.add_argument("--arrival-sessions", type=int, default=8, help="running streams in the arrival test")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        tts = voxstream.load_model(make_tiny_checkpoint(Path(tmp) / args.config, args.config), device="cpu")
    print(f"config {args.config}, CPU {tts.dtype}, {args.threads} threads, {args.patches} patches per session\n")
    throughput_table(tts, [int(c) for c in args.sessions.split(",")], args.patches)
    arrival_gaps(tts, args.arrival_sessions, args.patches, arrivals=args.arrival_sessions)


if __name__ == "__main__":
    main()
