"""Benchmark (not a test): what the micro-batcher buys on CPU, and what arrivals cost running streams.

    python scripts/bench_engine.py [--config voxcpm2] [--patches 16] [--sessions 1,2,4,8,16,32]

For each concurrency c, the same c sessions (fixed length: ``--patches`` patches each, distinct
texts and seeds) run two ways, one right after the other:

* batched: one engine with c slots, all sessions admitted together, one batched step per patch;
* sequential: the same sessions one after another at batch 1 (an engine with one slot).

Throughput is generated audio seconds per wall second. Then, with ``--arrival-sessions`` streams
running, new sessions keep arriving (one every few steps) and the script reports the gap between
consecutive chunks of the running streams: the worst gap against the median step.

    python scripts/bench_engine.py --host-overhead --sessions 768 [--json out.json]

measures instead the engine's own host work per step: ``Engine.step`` over a runner whose model
compute is stubbed out (the decode step returns zeros and the VAE keeps one value of state per
row), so what remains is the scheduler, the runner's bookkeeping, the one upload and one read of
the step, and turning the outputs into chunks. It reports ``host_us_per_row_per_step``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

import voxwire
from voxwire.engine import Engine, EngineConfig, Request, RunnerOptions, SynthesisParams
from voxwire.engine.kv_pool import bytes_per_position
from voxwire.engine.runner import ModelRunner
from voxwire.model.audio_vae import VAEStreamState
from voxwire.tiny.checkpoint import make_tiny_checkpoint
from voxwire.tts import VoxCPM

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
    return [Request(f"s{offset + i}", TEXTS[(offset + i) % len(TEXTS)], p) for i, p in enumerate(params)]


def run_all(tts: VoxCPM, requests: list[Request], slots: int) -> float:
    """Wall seconds to finish every request on an engine with ``slots`` rows."""
    engine = Engine(
        ModelRunner(tts, RunnerOptions(num_slots=slots, max_length=256)),
        EngineConfig(max_running=slots, max_waiting=len(requests)),
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
    engine = Engine(ModelRunner(tts, RunnerOptions(num_slots=slots, max_length=256)), EngineConfig(max_running=slots))
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
            if out.request_id in long_ids and out.audio.size:
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


def stub_model_compute(tts: VoxCPM) -> None:
    """Replace the decode step's model compute and the VAE by trivial ops of the same shapes, in place."""
    config = tts.config
    silence = torch.zeros(1, config.samples_per_patch)

    def decode_step(state, base_cache, residual_cache, noise, cfg_value, schedule):  # noqa: ANN001
        batch = state.positions.size(0)
        state.positions.add_(1)
        patch = noise.transpose(1, 2)
        return patch, torch.zeros(batch, 2, dtype=patch.dtype)

    def new_state(batch_size: int) -> VAEStreamState:
        return VAEStreamState([torch.zeros(batch_size, 1, 1)])

    def decode(latents: torch.Tensor, state: VAEStreamState) -> torch.Tensor:
        return silence.expand(latents.size(0), -1)

    tts.model.decode_step = decode_step  # type: ignore[method-assign]
    tts.vae_decoder.new_state = new_state  # type: ignore[method-assign]
    tts.vae_decoder.decode = decode  # type: ignore[method-assign]
    tts.vae_decoder.warm = lambda context, dtype, state: None  # type: ignore[method-assign]


def host_overhead(tts: VoxCPM, sessions_count: int, steps: int) -> dict[str, float]:
    """Seconds of ``Engine.step`` per row with the model compute stubbed (see the module docstring)."""
    stub_model_compute(tts)
    patches = steps + 3
    blocks = sessions_count * (-(-(64 + patches) // 16)) + 1  # prompt and patches of each request, and the null block
    runner = ModelRunner(
        tts,
        RunnerOptions(
            num_slots=sessions_count,
            max_length=256,
            kv_cache_bytes=blocks * 16 * bytes_per_position(tts),
        ),
    )
    config = EngineConfig(max_running=sessions_count, max_waiting=sessions_count, max_prefill_tokens_per_step=1 << 20)
    engine = Engine(runner, config)
    for i in range(sessions_count):
        # Long enough a text that the length cap is max_len, not the text's.
        params = SynthesisParams(min_len=patches, max_len=patches, seed=i)
        engine.add(Request(f"h{i}", "Streams keep talking here. " * 4, params))
    engine.step()  # admission and prefill of everyone (not measured)
    engine.step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        outputs = engine.step()
        times.append(time.perf_counter() - start)
        assert len(outputs) == sessions_count and all(not o.finished for o in outputs)
    # The median step: this machine's CPUs are shared, and a neighbour's burst is not our host cost.
    seconds = statistics.median(times)
    return {
        "sessions": sessions_count,
        "steps": steps,
        "host_ms_per_step": seconds * 1e3,
        "host_us_per_row_per_step": seconds / sessions_count * 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description="micro-batcher throughput and arrival gaps on CPU")
    parser.add_argument("--config", default="voxcpm2", help="a voxwire.tiny.configs.ALL_CONFIGS name")
    parser.add_argument("--patches", type=int, default=16, help="patches per session")
    parser.add_argument("--sessions", default="1,2,4,8,16,32", help="concurrency levels")
    parser.add_argument("--arrival-sessions", type=int, default=8, help="running streams in the arrival test")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: 2; 1 with --host-overhead)")
    parser.add_argument("--host-overhead", action="store_true", help="measure host work per row per step instead")
    parser.add_argument("--steps", type=int, default=50, help="timed steps of --host-overhead (median reported)")
    parser.add_argument("--json", type=Path, help="also write the --host-overhead result here")
    args = parser.parse_args()
    # Host work is one thread's (the engine thread's): intra-op threads only add synchronisation to it.
    threads = args.threads or (1 if args.host_overhead else 2)
    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory() as tmp:
        tts = voxwire.load_model(make_tiny_checkpoint(Path(tmp) / args.config, args.config), device="cpu")
    if args.host_overhead:
        result = host_overhead(tts, int(args.sessions.split(",")[-1]), args.steps)
        print(json.dumps(result))
        if args.json is not None:
            args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        return
    print(f"config {args.config}, CPU {tts.dtype}, {threads} threads, {args.patches} patches per session\n")
    throughput_table(tts, [int(c) for c in args.sessions.split(",")], args.patches)
    arrival_gaps(tts, args.arrival_sessions, args.patches, arrivals=args.arrival_sessions)


if __name__ == "__main__":
    main()
