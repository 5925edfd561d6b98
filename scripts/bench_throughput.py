"""Benchmark (not a test): file requests batched by the engine, against the reference one after another, on CPU.

Run it with the reference environment's python to get the reference column (``bash scripts/reference/setup_env.sh``
installs voxwire there too); under any other python that column is left out, with a note:

    .venv-reference/bin/python scripts/bench_throughput.py [--config voxcpm-0.5b-shape] [--patches 12] \\
        [--concurrency 1,4,16,32] [--json out.json]

One random checkpoint (published layout, ``--config``'s shape), CPU float32, ``--threads`` for both
implementations. For each concurrency c, c file requests (distinct texts, seeds 0..c-1, ``--patches`` patches each:
min_len = max_len, so every implementation generates the same audio length) are submitted at once and run to
completion, one way right after the other:

* voxwire real-time: the engine as ``voxwire serve`` builds it by default (``EngineSettings``' engine config and
  runner options, so the runner measures its step cost at start-up), with ``max_sessions`` = the largest c, the
  requests as the HTTP routes send them (``max_ahead_s=math.inf``), stepped by ``EngineLoop`` on the real clock.
  A request the policy sheds (``OverBudgetError``: HTTP 503 busy) is submitted again ``--retry-after-s`` later
  (the server's ``Retry-After`` is 1 s), as a client honouring it would; the table counts those refusals, and their
  RTF runs from the first submission.
* voxwire batch: the same real-time engine, the requests at ``"priority": "batch"`` (``Priority.BATCH``, what an
  offline job asks for: never shed, run in what real-time rows leave, at least once every ``--max-batch-gap-ms``),
  the engine's ``--max-batch-sessions`` = the largest c.
* voxwire ``--no-realtime``: the same with the FIFO policy.
* reference, one after another (a Gradio demo with concurrency 1): the reference's offline ``generate`` of each
  request at the same length, CFG and timesteps. Its rate does not depend on c, so ``--reference-requests`` of them
  are timed once, before the levels.

Reported per c: audio seconds per wall second (all requests' audio over the wall time from submission to the last
chunk) and per-request RTF (from its submission to its last chunk, over its audio's duration), p50 and p90.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import voxwire
from bench_engine import TEXTS, sessions
from voxwire.chunk import Chunk
from voxwire.client.bench.measure import percentiles
from voxwire.engine import Engine, FinishReason, OverBudgetError, Priority, Request, SynthesisParams
from voxwire.engine.loop import EngineLoop
from voxwire.engine.runner import ModelRunner
from voxwire.serving.server_config import EngineSettings
from voxwire.tiny.checkpoint import make_tiny_checkpoint
from voxwire.tts import VoxCPM


def reference_loader() -> Callable[[Path], Any] | None:
    """``bench_model.float32_reference``, or None where this python has no reference package."""
    try:
        from bench_model import float32_reference
    except ModuleNotFoundError as missing:  # bench_model imports the reference package
        if missing.name != "voxcpm":
            raise
        return None
    return float32_reference


@dataclass(frozen=True)
class Level:
    """One concurrency level run one way."""

    wall_s: float
    """From submitting every request to the last one's last chunk."""
    audio_s: float
    """Audio generated, all requests together."""
    rtfs: list[float]
    """Per request: from its (first) submission to its last chunk, over its audio's duration."""
    refusals: int = 0
    """Submissions the real-time policy shed (``OverBudgetError``), each retried ``Retry-After`` later."""

    @property
    def audio_per_wall_s(self) -> float:
        return self.audio_s / self.wall_s

    def summary(self) -> dict[str, Any]:
        rtf = percentiles(self.rtfs)
        return {
            "wall_s": self.wall_s,
            "audio_s": self.audio_s,
            "audio_s_per_wall_s": self.audio_per_wall_s,
            "rtf_p50": rtf["p50"],
            "rtf_p90": rtf["p90"],
            "refusals": self.refusals,
        }


def serve_engine(tts: VoxCPM, realtime: bool, slots: int, max_length: int) -> Engine:
    """The engine ``voxwire serve`` builds (``--no-realtime`` when not ``realtime``) with ``slots`` sessions, every
    one of which batch requests may hold."""
    settings = EngineSettings(realtime=realtime, max_sessions=slots, max_length=max_length, max_batch_sessions=slots)
    return Engine(ModelRunner(tts, settings.runner_options()), settings.engine_config())


def file_requests(count: int, patches: int, offset: int = 0, priority: Priority = Priority.REALTIME) -> list[Request]:
    """``count`` requests of ``patches`` patches each, as the HTTP routes send them (no lead bound)."""
    requests = sessions(count, patches, offset)
    return [dataclasses.replace(request, max_ahead_s=math.inf, priority=priority) for request in requests]


def run_level(engine: Engine, requests: list[Request], sample_rate: int, retry_after_s: float) -> Level:
    """Submit every request at once and step ``engine`` as the server's engine thread does until all finished; a
    request the engine sheds is submitted again ``retry_after_s`` later."""
    samples: Counter[str] = Counter()
    finished_at: dict[str, float] = {}

    def deliver(chunks: list[Chunk]) -> None:
        now = time.monotonic()
        for chunk in chunks:
            samples[chunk.request_id] += chunk.audio.size
            if chunk.finished:
                if chunk.finish_reason not in (FinishReason.STOP, FinishReason.LENGTH):
                    raise RuntimeError(f"{chunk.request_id} ended {chunk.finish_reason}: {chunk.error}")
                finished_at[chunk.request_id] = now

    loop = EngineLoop(engine, deliver)
    submitted = time.monotonic()
    pending, retry_at, refusals = requests, submitted, 0
    while len(finished_at) < len(requests):
        if pending and time.monotonic() >= retry_at:
            refused = []
            for request in pending:
                try:
                    loop.add(request)
                except OverBudgetError:
                    refused.append(request)
            pending, refusals = refused, refusals + len(refused)
            retry_at = time.monotonic() + retry_after_s
        if not loop.run_due():
            # Nothing due: wait for the engine's next step or the next retry, whichever comes first.
            retry_in = retry_at - time.monotonic() if pending else math.inf
            time.sleep(max(0.0, min(loop.wait_s(), retry_in)))
    audio_s = {rid: count / sample_rate for rid, count in samples.items()}
    return Level(
        wall_s=max(finished_at.values()) - submitted,
        audio_s=sum(audio_s.values()),
        rtfs=[(finished_at[rid] - submitted) / audio_s[rid] for rid in finished_at],
        refusals=refusals,
    )


def reference_one_after_another(ref: Any, count: int, patches: int) -> Level:
    """The reference's offline ``generate`` of ``count`` requests, one after another (each timed alone)."""
    defaults = SynthesisParams()
    sample_rate = ref.tts_model.sample_rate

    def generate(text: str, seed: int, length: int) -> float:
        """Seconds of audio made."""
        torch.manual_seed(seed)
        wav = ref.generate(
            text,
            cfg_value=defaults.cfg_value,
            inference_timesteps=defaults.inference_timesteps,
            min_len=length,
            max_len=length,
            retry_badcase=False,  # random weights look like a bad case: its retries would regenerate
        )
        return wav.size / sample_rate

    generate(TEXTS[0], 0, 2)  # warm-up: first-call allocations and caches
    start = time.monotonic()
    audio, rtfs = 0.0, []
    for i in range(count):
        began = time.monotonic()
        seconds = generate(TEXTS[i % len(TEXTS)], i, patches)
        rtfs.append((time.monotonic() - began) / seconds)
        audio += seconds
    return Level(wall_s=time.monotonic() - start, audio_s=audio, rtfs=rtfs)


def ratio(numerator: float, denominator: float | None) -> str:
    return "-" if denominator is None else f"{numerator / denominator:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description="batched file requests against the reference one after another")
    parser.add_argument("--config", default="voxcpm-0.5b-shape", help="a voxwire.tiny.configs.ALL_CONFIGS name")
    parser.add_argument("--patches", type=int, default=12, help="patches per request")
    parser.add_argument("--concurrency", default="1,4,16,32", help="requests submitted at once, per level")
    parser.add_argument("--reference-requests", type=int, default=4, help="requests the reference generates, timed")
    parser.add_argument("--max-length", type=int, default=256, help="--max-length of the engines (LM positions)")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    # The server's header is serving.edge.api_errors.RETRY_AFTER_S, which the reference environment cannot import
    # (it has no aiohttp).
    parser.add_argument("--retry-after-s", type=float, default=1.0, help="a shed request is retried this much later")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    counts = [int(c) for c in args.concurrency.split(",")]
    began = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        path = make_tiny_checkpoint(Path(tmp) / args.config, args.config)
        load_reference = reference_loader()
        ref = None if load_reference is None else load_reference(path)
        tts = voxwire.load_model(path, device="cpu", dtype="float32")
    audio_s = args.patches * tts.samples_per_patch / tts.sample_rate
    print(
        f"config {args.config}, CPU float32, {args.threads} threads, "
        f"{args.patches} patches ({audio_s:.2f} s of audio) per request\n"
    )
    reference = None
    if ref is None:
        print("reference: not importable in this python (run it with the reference environment's): column left out")
    else:
        count = args.reference_requests
        reference = reference_one_after_another(ref, count, args.patches)
        print(
            f"reference: {count} requests one after another, timed once (its rate does not depend on c): "
            f"{reference.audio_per_wall_s:.3f} audio s / wall s, {reference.audio_s / count:.2f} s of audio per request"
        )
    built = time.monotonic()
    realtime_engine = serve_engine(tts, True, max(counts), args.max_length)
    engines = {
        "realtime": realtime_engine,
        "batch": realtime_engine,  # the same engine; the requests ask for Priority.BATCH
        "no_realtime": serve_engine(tts, False, max(counts), args.max_length),
    }
    priorities = {"realtime": Priority.REALTIME, "batch": Priority.BATCH, "no_realtime": Priority.REALTIME}
    print(f"engines built in {time.monotonic() - built:.0f} s (the real-time one's runner measures its step cost)")
    for engine in {id(engine): engine for engine in engines.values()}.values():  # warm-up: first-call allocations
        run_level(engine, file_requests(2, 2, offset=1000), tts.sample_rate, args.retry_after_s)
    print(
        "\n| c | voxwire real-time audio s / wall s | RTF p50 / p90 | busy refusals "
        "| voxwire batch audio s / wall s | RTF p50 / p90 "
        "| voxwire --no-realtime audio s / wall s | RTF p50 / p90 "
        "| reference (one after another) audio s / wall s | RTF p50 | batch / reference |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    ref_rate = None if reference is None else reference.audio_per_wall_s
    ref_cells = "- | -" if reference is None else f"{ref_rate:.3f} | {reference.summary()['rtf_p50']:.2f}"
    levels = []
    for count in counts:
        runs = {
            mode: run_level(
                engine, file_requests(count, args.patches, priority=priorities[mode]), tts.sample_rate,
                args.retry_after_s,
            )
            for mode, engine in engines.items()
        }  # fmt: skip
        live, batch, fifo = (runs[mode].summary() for mode in ("realtime", "batch", "no_realtime"))
        print(
            f"| {count} | {live['audio_s_per_wall_s']:.3f} | {live['rtf_p50']:.2f} / {live['rtf_p90']:.2f} "
            f"| {live['refusals']} | {batch['audio_s_per_wall_s']:.3f} | {batch['rtf_p50']:.2f} / "
            f"{batch['rtf_p90']:.2f} | {fifo['audio_s_per_wall_s']:.3f} | {fifo['rtf_p50']:.2f} / "
            f"{fifo['rtf_p90']:.2f} | {ref_cells} | {ratio(batch['audio_s_per_wall_s'], ref_rate)} |",
            flush=True,
        )
        levels.append({"concurrency": count, **{mode: run.summary() for mode, run in runs.items()}})
    print(f"\n{time.monotonic() - began:.0f} s in all")
    if args.json is not None:
        result = {
            "config": args.config,
            "threads": args.threads,
            "patches": args.patches,
            "reference": None if reference is None else {"requests": args.reference_requests, **reference.summary()},
            "levels": levels,
        }
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
