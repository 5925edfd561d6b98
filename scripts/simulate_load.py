"""Load simulator (not a test): the real ``Engine`` and ``Scheduler`` in virtual time, under a step-cost model.

    python scripts/simulate_load.py --cost "4ms+0.17ms/row+9.2us/token" --streams 256,512,768 --json out.json

Nothing sleeps: a virtual runner answers each ``StepPlan`` at once and the clock advances by what the
cost model says that step takes (``StepCost.seconds(decode rows, prefill tokens)``). Both scheduling
policies run on the same workload (same seed): the real-time policy (``EngineConfig.realtime``) and
today's default (every row every step, FIFO admission by a 512-token prefill budget).

Workload, per level of N streams: streams arrive as a Poisson process whose rate keeps N live
(N / the mean stream lifetime, which is the lead plus its audio). A stream is an utterance of 1-3
sentences (uniform), each of 15-60 patches (uniform); a sentence is one request of
``--prompt-tokens`` + 2/3 of its patches in prefill positions. A stream's next sentence arrives when
its previous one is done, as the server's segmenter sends them; its request carries the time its
listener's buffer runs dry (``Request.playback_due``). Each stream has a listener that starts playing
``--lead-ms`` after its first chunk left and then plays in real time, one chunk per ``--chunk-ms``.

Reported over the streams arriving in the measured window (after ``--warmup-s``, for ``--duration-s``;
arrivals continue ``--tail-s`` longer so the load holds while they finish): time to first audio
(arrival to first chunk out; a stream still waiting at the end counts with the time it waited),
late chunks (a chunk out after its listener needed it, or still missing when the simulation ends),
the audio a listener had buffered when each chunk left (what a barge-in discards), and the mean
number of decode rows per step in the window.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from voxwire.engine import Engine, EngineConfig, Prepared, Request, RunnerOutput, StepPlan
from voxwire.engine.cost_model import StepCost

CHUNK = np.zeros(1, dtype=np.float32)
EPSILON_S = 1e-9  # float noise in the virtual clock is not lateness


@dataclass(frozen=True)
class Workload:
    chunk_s: float = 0.16
    lead_s: float = 0.3
    sentences: tuple[int, int] = (1, 3)
    patches: tuple[int, int] = (15, 60)
    prompt_tokens: int = 64
    warmup_s: float = 30.0
    duration_s: float = 40.0
    tail_s: float = 15.0
    slots: int = 1024
    seed: int = 0

    @property
    def mean_lifetime_s(self) -> float:
        mean_sentences = sum(self.sentences) / 2
        mean_patches = sum(self.patches) / 2
        return self.lead_s + mean_sentences * mean_patches * self.chunk_s

    def prefill_tokens(self, patches: int) -> int:
        return self.prompt_tokens + (2 * patches) // 3


@dataclass(frozen=True)
class Policy:
    name: str
    config: EngineConfig


class VirtualRunner:
    """A ``RealtimeRunner`` that computes nothing: each sentence ends after its drawn patch count.

    Its KV pool holds every slot's longest request, so KV memory never limits admission here."""

    block_size = 64
    graph_captures = 0
    graph_capture_seconds = 0.0

    def __init__(self, num_slots: int, cost: StepCost, chunk_s: float) -> None:
        self.num_slots = num_slots
        self.num_kv_blocks = num_slots * 8 + 1  # 512 positions a slot, and the null block
        self.step_cost = cost
        self.chunk_seconds = chunk_s
        self.patches: dict[str, int] = {}
        """Per request not yet prefilled: its length in patches (the length cap it reports)."""
        self.prompts: dict[str, int] = {}
        """Per request not yet prepared: its prompt's positions."""
        self.last_seconds = 0.0
        self.last_rows = 0

    def prepare(self, request: Request) -> Prepared:
        prompt = self.prompts.pop(request.request_id)
        return Prepared(prompt, prompt + self.patches[request.request_id])

    def execute(self, plan: StepPlan) -> RunnerOutput:
        rows = len(plan.decode_slots)
        tokens = sum(item.prepared.prompt_positions for item in plan.prefills)
        # A plan of housekeeping alone launches no model work.
        self.last_seconds = self.step_cost.seconds(rows, tokens) if rows or tokens else 0.0
        self.last_rows = rows
        caps = {item.request_id: self.patches.pop(item.request_id) for item in plan.prefills}
        return RunnerOutput((CHUNK,) * rows, (False,) * rows, caps)


@dataclass
class Stream:
    arrival: float
    sentences: list[int]
    measured: bool
    sentence: int = 0
    chunks: int = 0
    start: float | None = None
    """When the listener plays chunk 0 (first chunk out + lead)."""
    first_chunk_at: float | None = None

    @property
    def total(self) -> int:
        return sum(self.sentences)


@dataclass
class Level:
    streams: int
    ttfa_s: list[float] = field(default_factory=list)
    late: int = 0
    chunks: int = 0
    ahead_s: float = 0.0
    """Sum over chunks of the audio their listener still had buffered when each left."""
    step_rows: list[int] = field(default_factory=list)
    step_seconds: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, float | int]:
        ttfa = sorted(self.ttfa_s)
        return {
            "streams": self.streams,
            "ttfa_p50_ms": round(_quantile(ttfa, 0.50) * 1e3, 1),
            "ttfa_p99_ms": round(_quantile(ttfa, 0.99) * 1e3, 1),
            "late_chunks": self.late,
            "chunks": self.chunks,
            "mean_ahead_ms": round(self.ahead_s / self.chunks * 1e3, 1) if self.chunks else 0.0,
            "mean_batch": round(statistics.fmean(self.step_rows), 1) if self.step_rows else 0.0,
            "mean_step_ms": round(statistics.fmean(self.step_seconds) * 1e3, 1) if self.step_seconds else 0.0,
        }


def _quantile(ordered: list[float], q: float) -> float:
    """Nearest-rank quantile (no interpolation: p99 of 100 values is the 99th)."""
    if not ordered:
        return math.nan
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def _arrivals(rate: float, until: float, rng: random.Random) -> Iterator[float]:
    t = rng.expovariate(rate)
    while t < until:
        yield t
        t += rng.expovariate(rate)


def simulate(policy: Policy, cost: StepCost, work: Workload, n_streams: int) -> Level:
    """Run one policy at one load level; see the module docstring for what is measured."""
    rng = random.Random(work.seed * 1_000_003 + n_streams)
    runner = VirtualRunner(work.slots, cost, work.chunk_s)
    engine = Engine(runner, policy.config)
    window = (work.warmup_s, work.warmup_s + work.duration_s)
    end = window[1] + work.tail_s
    level = Level(n_streams)
    streams: dict[str, Stream] = {}
    owner: dict[str, str] = {}  # request id -> stream id

    def add_sentence(sid: str, due: float | None) -> None:
        stream = streams[sid]
        patches = stream.sentences[stream.sentence]
        rid = f"{sid}.{stream.sentence}"
        runner.patches[rid] = patches
        runner.prompts[rid] = work.prefill_tokens(patches)
        owner[rid] = sid
        text = "x" * patches  # only its presence matters: the virtual runner reads the drawn length
        engine.add(Request(rid, text, playback_lead_s=work.lead_s, playback_due=due))

    arrivals = _arrivals(n_streams / work.mean_lifetime_s, end, rng)
    next_arrival = next(arrivals, math.inf)
    now = 0.0
    while now < end:
        while next_arrival <= now:
            sid = f"s{len(streams)}"
            count = rng.randint(*work.sentences)
            sentences = [rng.randint(*work.patches) for _ in range(count)]
            streams[sid] = Stream(next_arrival, sentences, window[0] <= next_arrival < window[1])
            add_sentence(sid, None)
            next_arrival = next(arrivals, math.inf)
        ready = engine.next_step_at(now)
        if ready > now:
            now = min(ready, next_arrival, end)
            continue
        outputs = engine.step(now)
        done = now + runner.last_seconds
        engine.mark_sent(done)
        if window[0] <= now < window[1] and runner.last_rows:
            level.step_rows.append(runner.last_rows)
            level.step_seconds.append(runner.last_seconds)
        for output in outputs:
            assert output.finish_reason is None or output.finish_reason.value == "length", output
            stream = streams[owner[output.request_id]]
            if stream.start is None:
                stream.first_chunk_at = done
                stream.start = done + work.lead_s
            if stream.measured:
                ahead = stream.start + stream.chunks * work.chunk_s - done
                level.chunks += 1
                level.late += ahead < -EPSILON_S
                level.ahead_s += max(0.0, ahead)
            stream.chunks += 1
            if output.finished:
                sid = owner.pop(output.request_id)
                stream.sentence += 1
                if stream.sentence < len(stream.sentences):
                    add_sentence(sid, stream.start + stream.chunks * work.chunk_s)
        now = done
    for stream in streams.values():
        if not stream.measured:
            continue
        first = stream.first_chunk_at
        level.ttfa_s.append((first if first is not None else now) - stream.arrival)
        level.late += _overdue(stream, now, work.chunk_s)
    return level


def _overdue(stream: Stream, now: float, chunk_s: float) -> int:
    """Chunks of ``stream`` its listener needed before ``now`` that never came."""
    needed_by_now = stream.total if stream.start is None else math.ceil((now - stream.start) / chunk_s)
    if stream.start is None and now - stream.arrival < chunk_s:
        return 0  # arrived at the very end: its first chunk is not late yet
    return max(0, min(stream.total, needed_by_now) - stream.chunks)


def policies(lead_s: float) -> tuple[Policy, Policy]:
    common = {"max_running": 1, "max_waiting": 1_000_000}
    realtime = EngineConfig(**common, realtime=True, playback_lead_s=lead_s)  # type: ignore[arg-type]
    fifo = EngineConfig(**common, max_prefill_tokens_per_step=512)  # type: ignore[arg-type]
    return Policy("real-time", realtime), Policy("FIFO, 512-token budget", fifo)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cost", default="4ms+0.17ms/row+9.2us/token", help="step cost model (StepCost.parse)")
    parser.add_argument("--streams", default="256,512,768", help="live streams per level, comma-separated")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--chunk-ms", type=float, default=160.0, help="audio per chunk (VoxCPM2: 160)")
    parser.add_argument("--lead-ms", type=float, default=300.0, help="each listener's lead (default 300)")
    parser.add_argument("--prompt-tokens", type=int, default=64, help="voice prompt positions per sentence")
    parser.add_argument("--slots", type=int, default=1024, help="engine slots (max_running)")
    parser.add_argument("--warmup-s", type=float, default=30.0, help="arrivals before the measured window")
    parser.add_argument("--duration-s", type=float, default=40.0, help="measured window of arrivals")
    parser.add_argument("--tail-s", type=float, default=15.0, help="load kept after the window")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only-realtime", action="store_true", help="skip today's policy (the baseline)")
    args = parser.parse_args(argv)
    cost = StepCost.parse(args.cost)
    levels = [int(n) for n in args.streams.split(",")]
    work = Workload(
        chunk_s=args.chunk_ms / 1e3,
        lead_s=args.lead_ms / 1e3,
        prompt_tokens=args.prompt_tokens,
        warmup_s=args.warmup_s,
        duration_s=args.duration_s,
        tail_s=args.tail_s,
        slots=args.slots,
        seed=args.seed,
    )
    chosen = policies(work.lead_s)[: 1 if args.only_realtime else 2]
    results: dict[str, list[dict[str, float | int]]] = {}
    print(f"cost {cost}, chunk {args.chunk_ms:g} ms, lead {args.lead_ms:g} ms, {args.prompt_tokens} prompt tokens")
    print(
        "| streams | policy | TTFA p50 (ms) | TTFA p99 (ms) | late chunks | chunks | mean batch "
        "| mean step (ms) | mean buffered (ms) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for n in levels:
        for policy in chosen:
            config = replace(policy.config, max_running=work.slots)
            row = simulate(replace(policy, config=config), cost, work, n).summary()
            results.setdefault(policy.name, []).append(row)
            print(
                f"| {n} | {policy.name} | {row['ttfa_p50_ms']} | {row['ttfa_p99_ms']} | {row['late_chunks']} "
                f"| {row['chunks']} | {row['mean_batch']} | {row['mean_step_ms']} | {row['mean_ahead_ms']} |",
                flush=True,
            )
    if args.json is not None:
        out: dict[str, object] = {"cost": str(cost), "chunk_ms": args.chunk_ms, "lead_ms": args.lead_ms}
        out["levels"] = results[chosen[0].name]
        if len(chosen) > 1:
            out["baseline"] = {"policy": chosen[1].name, "levels": results[chosen[1].name]}
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
