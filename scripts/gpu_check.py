"""GPU check (run on a CUDA machine; needs nothing from the network; < 8 minutes on an H200):
correctness, then a performance table up to 768 sessions.

    python scripts/gpu_check.py [--config voxcpm2-shape] [--sessions 1,64,256,512,768] [--out results.json]

1. Builds a model with random weights in the real release's shapes (default VoxCPM2: 2.29 B parameters)
   straight in memory, through the same strict loading path as a checkpoint.
2. Correctness, in float32 with TF32 off: eight sessions with different texts, seeds, guidance and
   timestep counts, arriving at different steps, decoded together through the engine (CUDA graphs on)
   against each session alone (batch 1), and the graph path against the eager path.
3. Performance, in bfloat16 with TF32 on (the serving configuration) and CUDA graphs: one runner sized
   for the largest concurrency captures every graph up front (timed), with the KV pool sized by free
   memory; then for each concurrency c, c sessions of a fixed length start together. Reports the median
   step, time to first chunk, aggregate real-time factor, peak device memory, KV blocks in use, and the
   graphs captured during the timed run (must be 0). The decode attention path is named.

``--device cpu --config voxcpm2`` runs the same script on a tiny model in seconds (a smoke test).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from voxwire.config import ModelConfig
from voxwire.engine import Engine, EngineConfig, ParamLimits, Request, SynthesisParams
from voxwire.engine.runner import ModelRunner
from voxwire.loader import model_from_weights
from voxwire.model.audio_vae import fold_weight_norm, random_published_state_dict
from voxwire.model.paged_attention import attention_path
from voxwire.text.tokenizer import TextTokenizer
from voxwire.tiny.checkpoint import random_model_weights
from voxwire.tiny.configs import ALL_CONFIGS
from voxwire.tiny.tokenizer_files import write_tiny_tokenizer
from voxwire.tts import VoxCPM

TEXTS = [
    "Hello there, how are you today?",
    "The weather is lovely this afternoon, isn't it?",
    "今天天气很好。",
    "Numbers like 3.14 are read aloud.",
    "A short one.",
    "Streaming speech, one patch at a time.",
    "VoxCPM 语音合成 in real time!",
    "The last of eight different sentences.",
]


def build(name: str, device: torch.device) -> VoxCPM:
    config = ModelConfig.from_dict(ALL_CONFIGS[name], source=name)
    main = {k: v.to(torch.bfloat16) for k, v in random_model_weights(config, seed=0).items()}
    vae = fold_weight_norm(random_published_state_dict(config.audio_vae_config, config.vae_variant, seed=0))
    with tempfile.TemporaryDirectory() as tmp:
        write_tiny_tokenizer(Path(tmp))
        tokenizer = TextTokenizer.from_dir(tmp)
    return model_from_weights(config, tokenizer, main, vae, device=device, dtype=torch.float32, name=name)


def correctness_runner(tts: VoxCPM, slots: int, max_length: int, cuda_graphs: bool) -> ModelRunner:
    """A small runner: a KV pool of room for ``slots`` sessions at ``max_length``, graphs for 10 timesteps."""
    kv_bytes = (1 + slots * -(-max_length // 16)) * 16 * ModelRunner.bytes_per_position(tts)
    return ModelRunner(
        tts, num_slots=slots, max_length=max_length, kv_cache_bytes=kv_bytes, cuda_graphs=cuda_graphs, max_timesteps=10
    )


def run_engine(
    runner: ModelRunner, arrivals: dict[int, list[Request]]
) -> tuple[dict[str, np.ndarray], dict[str, float], list[float]]:
    """Audio per request, seconds from the run's start to each request's first chunk, and step times."""
    engine = Engine(
        runner,
        EngineConfig(
            max_running=runner.num_slots,
            max_waiting=max(sum(len(r) for r in arrivals.values()), 1),
            max_prefill_tokens_per_step=1 << 20,
            limits=ParamLimits(max_inference_timesteps=runner.max_timesteps),
        ),
    )
    chunks: dict[str, list[np.ndarray]] = {}
    first: dict[str, float] = {}
    steps: list[float] = []
    start = time.perf_counter()
    step = 0
    while step <= max(arrivals, default=0) or engine.has_work():
        for request in arrivals.get(step, []):
            engine.add(request)
        began = time.perf_counter()
        outputs = engine.step()
        now = time.perf_counter()
        steps.append(now - began)
        for out in outputs:
            if out.audio.size:
                chunks.setdefault(out.request_id, []).append(out.audio)
                first.setdefault(out.request_id, now - start)
        step += 1
    return {rid: np.concatenate(c) for rid, c in chunks.items()}, first, steps


def mixed_requests() -> dict[int, list[Request]]:
    params = [
        SynthesisParams(
            seed=10 + i,
            cfg_value=1.0 + 0.3 * i,
            inference_timesteps=(10, 6, 10, 4)[i % 4],
            min_len=6 + i,
            max_len=8 + i,
        )
        for i in range(8)
    ]
    requests = [Request(f"s{i}", TEXTS[i], 16, params[i]) for i in range(8)]
    return {0: requests[:3], 1: requests[3:5], 3: requests[5:]}


def check_correctness(tts: VoxCPM, max_length: int) -> dict[str, float]:
    graphs = tts.device.type == "cuda"
    together, _, _ = run_engine(correctness_runner(tts, 8, max_length, graphs), mixed_requests())
    eager, _, _ = run_engine(correctness_runner(tts, 8, max_length, False), mixed_requests())
    single = correctness_runner(tts, 1, max_length, graphs)
    worst_alone, worst_eager = 0.0, 0.0
    for requests in mixed_requests().values():
        for request in requests:
            alone, _, _ = run_engine(single, {0: [request]})
            a, b, c = together[request.request_id], alone[request.request_id], eager[request.request_id]
            if a.shape != b.shape or a.shape != c.shape:
                raise SystemExit(
                    f"FAIL: {request.request_id} lengths differ: batched {a.size}, alone {b.size}, eager {c.size}"
                )
            worst_alone = max(worst_alone, float(np.abs(a - b).max()))
            worst_eager = max(worst_eager, float(np.abs(a - c).max()))
    return {"batched_vs_alone_max_abs": worst_alone, "graphs_vs_eager_max_abs": worst_eager}


def measure(tts: VoxCPM, counts: list[int], patches: int, max_length: int, cuda_graphs: bool) -> dict:
    """One runner for the largest count (graphs captured up front, KV pool sized by free memory), then a
    timed run per count; returns the setup figures and one row per count."""
    cuda = tts.device.type == "cuda"
    seconds_per_patch = tts.samples_per_patch / tts.sample_rate
    began = time.perf_counter()
    runner = ModelRunner(tts, num_slots=max(counts), max_length=max_length, cuda_graphs=cuda_graphs, max_timesteps=10)
    setup = {
        "attention_path": attention_path(tts.device),
        "setup_seconds": time.perf_counter() - began,
        "graphs_captured_at_setup": runner.graph_captures,
        "kv_blocks_total": runner.num_kv_blocks - 1,
        "kv_block_bytes": runner.block_size * ModelRunner.bytes_per_position(tts),
        "kv_pool_gib": (runner.num_kv_blocks * runner.block_size * ModelRunner.bytes_per_position(tts)) / 2**30,
    }
    print(json.dumps(setup), flush=True)
    print(
        "| sessions | step ms (median) | first chunk ms (median) | aggregate RTF (audio s / wall s) | "
        "per-session x real time | peak GiB | KV blocks used | graph captures |\n|---|---|---|---|---|---|---|---|",
        flush=True,
    )
    rows = []
    for count in counts:
        params = [SynthesisParams(seed=10_000 + i, min_len=patches, max_len=patches) for i in range(count)]
        batch = {0: [Request(f"r{count}-{i}", TEXTS[i % len(TEXTS)], 16, params[i]) for i in range(count)]}
        blocks_used = sum(
            -(-runner.kv_positions(request) // runner.block_size) for request in batch[0]
        )  # all admitted together
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        captures = runner.graph_captures
        start = time.perf_counter()
        audio, first, steps = run_engine(runner, batch)
        wall = time.perf_counter() - start
        produced = sum(a.size for a in audio.values()) / tts.sample_rate
        rows.append(
            {
                "sessions": count,
                "step_ms_median": statistics.median(steps[1:]) * 1e3,
                "first_chunk_ms_median": statistics.median(first.values()) * 1e3,
                "first_chunk_ms_max": max(first.values()) * 1e3,
                "audio_seconds": produced,
                "wall_seconds": wall,
                "aggregate_rtf": produced / wall,
                "per_session_realtime_x": seconds_per_patch / statistics.median(steps[1:]),
                "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan"),
                "kv_blocks_used": blocks_used,
                "graph_captures_during_run": runner.graph_captures - captures,
            }
        )
        print(format_row(rows[-1]), flush=True)
    return {**setup, "rows": rows}


def format_row(row: dict) -> str:
    return (
        f"| {row['sessions']} | {row['step_ms_median']:.1f} | {row['first_chunk_ms_median']:.0f} "
        f"(max {row['first_chunk_ms_max']:.0f}) | {row['aggregate_rtf']:.1f} | "
        f"{row['per_session_realtime_x']:.1f} | {row['peak_gib']:.1f} | {row['kv_blocks_used']} | "
        f"{row['graph_captures_during_run']} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description="voxwire GPU correctness and performance check")
    parser.add_argument("--config", default="voxcpm2-shape")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--sessions", default="1,64,256,512,768")
    parser.add_argument("--patches", type=int, default=32, help="patches per session in the timing runs")
    parser.add_argument("--max-length", type=int, default=2048, help="KV positions per session")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device: run on a GPU machine, or pass --device cpu --config voxcpm2 for a smoke test")
    began = time.perf_counter()
    tts = build(args.config, device)
    print(f"built {args.config} on {device} in {time.perf_counter() - began:.0f} s", flush=True)
    # Correctness in exact float32 (TF32 off), then TF32 back on for the bf16 table (the VAE is float32).
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    correctness = check_correctness(tts, args.max_length)
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = True, True
    print(f"correctness (float32, TF32 off): {json.dumps(correctness)}", flush=True)
    ok = correctness["batched_vs_alone_max_abs"] <= 1e-3 and correctness["graphs_vs_eager_max_abs"] <= 1e-3
    print("PASS" if ok else "FAIL: batched output differs from per-session output", flush=True)
    tts.cast(torch.bfloat16)
    print(
        f"\n{args.config}, bfloat16, TF32 on, CUDA graphs={device.type == 'cuda'}, "
        f"{args.patches} patches per session, max_length {args.max_length}"
    )
    performance = measure(
        tts,
        [int(c) for c in args.sessions.split(",")],
        args.patches,
        args.max_length,
        cuda_graphs=device.type == "cuda",
    )
    captured_while_serving = sum(row["graph_captures_during_run"] for row in performance["rows"])
    if captured_while_serving:
        print(f"FAIL: {captured_while_serving} graphs captured during the timed runs", flush=True)
    print(f"\ntotal {time.perf_counter() - began:.0f} s")
    if args.out:
        results = {"config": args.config, "correctness": correctness, **performance}
        args.out.write_text(json.dumps(results, indent=2))
    sys.exit(0 if ok and not captured_while_serving else 1)


if __name__ == "__main__":
    main()
