"""GPU check (run on a CUDA machine; needs nothing from the network): correctness, then a performance table.

    python scripts/gpu_check.py [--config voxcpm2-shape] [--sessions 1,8,32,64,128] [--out results.json]

1. Builds a model with random weights in the real release's shapes (default VoxCPM2: 2.29 B parameters)
   straight in memory, through the same strict loading path as a checkpoint.
2. Correctness, in float32 with TF32 off: eight sessions with different texts, seeds, guidance and
   timestep counts, arriving at different steps, decoded together through the engine (CUDA graphs on)
   against each session alone (batch 1), and the graph path against the eager path.
3. Performance, in bfloat16 with CUDA graphs (the serving configuration): for each concurrency c, c
   sessions of a fixed length start together; reports the median engine step time, time to first chunk,
   and the aggregate real-time factor (generated audio seconds per wall second).

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

from voxstream.config import ModelConfig
from voxstream.engine import Engine, EngineConfig, Request, SynthesisParams
from voxstream.engine.runner import ModelRunner
from voxstream.loader import model_from_weights
from voxstream.model.audio_vae import fold_weight_norm, random_published_state_dict
from voxstream.text.tokenizer import TextTokenizer
from voxstream.tiny.checkpoint import random_model_weights
from voxstream.tiny.configs import ALL_CONFIGS
from voxstream.tiny.tokenizer_files import write_tiny_tokenizer
from voxstream.tts import VoxCPM

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
    vae = fold_weight_norm(random_published_state_dict(config.audio_vae_config, config.architecture, seed=0))
    with tempfile.TemporaryDirectory() as tmp:
        write_tiny_tokenizer(Path(tmp))
        tokenizer = TextTokenizer.from_dir(tmp)
    return model_from_weights(config, tokenizer, main, vae, device=device, dtype=torch.float32, name=name)


def run_engine(
    tts: VoxCPM, arrivals: dict[int, list[Request]], slots: int, max_length: int, cuda_graphs: bool
) -> tuple[dict[str, np.ndarray], dict[str, float], list[float]]:
    """Audio per request, seconds from the run's start to each request's first chunk, and step times."""
    runner = ModelRunner(tts, num_slots=slots, max_length=max_length, cuda_graphs=cuda_graphs)
    engine = Engine(
        runner,
        EngineConfig(max_running=slots, max_waiting=max(len(arrivals), 1) * slots, max_prefill_tokens_per_step=1 << 20),
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
            if out.chunk.size:
                chunks.setdefault(out.request_id, []).append(out.chunk)
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
    together, _, _ = run_engine(tts, mixed_requests(), slots=8, max_length=max_length, cuda_graphs=graphs)
    eager, _, _ = run_engine(tts, mixed_requests(), slots=8, max_length=max_length, cuda_graphs=False)
    worst_alone, worst_eager = 0.0, 0.0
    for requests in mixed_requests().values():
        for request in requests:
            alone, _, _ = run_engine(tts, {0: [request]}, slots=1, max_length=max_length, cuda_graphs=graphs)
            a, b, c = together[request.request_id], alone[request.request_id], eager[request.request_id]
            if a.shape != b.shape or a.shape != c.shape:
                raise SystemExit(
                    f"FAIL: {request.request_id} lengths differ: batched {a.size}, alone {b.size}, eager {c.size}"
                )
            worst_alone = max(worst_alone, float(np.abs(a - b).max()))
            worst_eager = max(worst_eager, float(np.abs(a - c).max()))
    return {"batched_vs_alone_max_abs": worst_alone, "graphs_vs_eager_max_abs": worst_eager}


def measure(tts: VoxCPM, counts: list[int], patches: int, max_length: int, cuda_graphs: bool) -> list[dict]:
    seconds_per_patch = tts.samples_per_patch / tts.sample_rate
    rows = []
    for count in counts:

        def batch(offset: int, n: int = count) -> dict[int, list[Request]]:
            params = [SynthesisParams(seed=offset + i, min_len=patches, max_len=patches) for i in range(n)]
            return {0: [Request(f"r{offset + i}", TEXTS[i % len(TEXTS)], 16, params[i]) for i in range(n)]}

        run_engine(tts, batch(0), slots=count, max_length=max_length, cuda_graphs=cuda_graphs)  # capture graphs
        if tts.device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        audio, first, steps = run_engine(
            tts, batch(10_000), slots=count, max_length=max_length, cuda_graphs=cuda_graphs
        )
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
            }
        )
        print(format_row(rows[-1]), flush=True)
    return rows


def format_row(row: dict) -> str:
    return (
        f"| {row['sessions']} | {row['step_ms_median']:.1f} | {row['first_chunk_ms_median']:.0f} "
        f"(max {row['first_chunk_ms_max']:.0f}) | {row['aggregate_rtf']:.1f} | "
        f"{row['per_session_realtime_x']:.1f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description="voxstream GPU correctness and performance check")
    parser.add_argument("--config", default="voxcpm2-shape")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--sessions", default="1,8,32,64,128")
    parser.add_argument("--patches", type=int, default=32, help="patches per session in the timing runs")
    parser.add_argument("--max-length", type=int, default=2048, help="KV positions per session")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device: run on a GPU machine, or pass --device cpu --config voxcpm2 for a smoke test")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    began = time.perf_counter()
    tts = build(args.config, device)
    print(f"built {args.config} on {device} in {time.perf_counter() - began:.0f} s", flush=True)
    correctness = check_correctness(tts, args.max_length)
    print(f"correctness (float32, TF32 off): {json.dumps(correctness)}", flush=True)
    ok = correctness["batched_vs_alone_max_abs"] <= 1e-3 and correctness["graphs_vs_eager_max_abs"] <= 1e-3
    print("PASS" if ok else "FAIL: batched output differs from per-session output", flush=True)
    tts.cast(torch.bfloat16)
    print(
        f"\n{args.config}, bfloat16, CUDA graphs={device.type == 'cuda'}, {args.patches} patches per session, "
        f"max_length {args.max_length}"
    )
    print(
        "| sessions | step ms (median) | first chunk ms (median) | aggregate RTF (audio s / wall s) | "
        "per-session x real time |\n|---|---|---|---|---|",
        flush=True,
    )
    rows = measure(
        tts,
        [int(c) for c in args.sessions.split(",")],
        args.patches,
        args.max_length,
        cuda_graphs=device.type == "cuda",
    )
    print(f"\ntotal {time.perf_counter() - began:.0f} s")
    if args.out:
        args.out.write_text(json.dumps({"config": args.config, "correctness": correctness, "rows": rows}, indent=2))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
