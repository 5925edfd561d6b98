"""A fake runner that behaves like a real state pool, and fixtures that build engines around it.

``FakeRunner`` keeps one owner per row and one state per request, exactly like the real runner's
KV/VAE pool, and asserts the plan contract on every step: released rows are freed, moves go from
an occupied row to a free one, prefills never land on an occupied row (no double allocation) and
get KV blocks no running request holds, enough for every position they can reach, the occupied
rows stay ``0..n-1``, the decode rows are all of them (what the FIFO policy plans) or, for
``RealtimeFakeRunner``, an ascending subset that includes every row just prefilled, and each row's
step index continues where that request left off. Chunks are a pure function of (request id, step
index), so tests can check exactly which chunk each session received.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pytest

from voxwire.chunk import EMPTY_AUDIO, Audio
from voxwire.engine import Engine, EngineConfig, Prepared, Priority, Request, RunnerOutput, StepPlan, SynthesisParams
from voxwire.engine.cost_model import StepCost

if TYPE_CHECKING:
    from voxwire.tts import VoxCPM

PATCH = 4  # samples per chunk in these tests


def fake_chunk(request_id: str, step_index: int) -> Audio:
    """The audio FakeRunner emits for ``request_id`` at ``step_index``."""
    tag = zlib.crc32(request_id.encode()) % 65536
    return np.array([tag, step_index, 0.5, -0.5], dtype=np.float32)


def text_length_cap(request: Request) -> int:
    """The real runner's rule with characters standing in for text tokens."""
    return min(len(request.text) * 6 + 10, request.params.max_len)


def text_positions(request: Request) -> int:
    """A prompt's positions with characters standing in for text tokens."""
    return len(request.text)


@dataclass
class FakeRunner:
    num_slots: int = 8
    num_kv_blocks: int = 1 << 20
    block_size: int = 16
    graph_captures: int = 0
    graph_capture_seconds: float = 0.0
    stop: Callable[[str, int], bool] = lambda rid, i: False
    length_cap: Callable[[Request], int] = text_length_cap
    prompt_positions: Callable[[Request], int] = text_positions
    prefill_error: Callable[[Request], str | None] = lambda request: None
    row_error: Callable[[str, int], str | None] = lambda rid, i: None
    fail: Callable[[StepPlan], bool] = lambda plan: False
    delay: float = 0.0
    subsets: bool = False
    """Whether a plan may decode a subset of the occupied rows (the real-time policy's runners)."""
    plans: list[StepPlan] = field(default_factory=list)
    rows: list[str | None] = field(init=False)
    # Per request: the step index it will decode next (its "KV length").
    state: dict[str, int] = field(default_factory=dict)
    # Per running request: the KV blocks its prefill was given.
    blocks: dict[str, tuple[int, ...]] = field(default_factory=dict)
    prepared: list[str] = field(default_factory=list)
    """The ids of the requests ``prepare`` laid out, in order."""

    def __post_init__(self) -> None:
        self.rows = [None] * self.num_slots

    @property
    def is_empty(self) -> bool:
        return not self.state and all(owner is None for owner in self.rows)

    def prepare(self, request: Request) -> Prepared:
        self.prepared.append(request.request_id)
        positions = self.prompt_positions(request)
        return Prepared(positions, positions + self.length_cap(request), payload=request.request_id)

    def execute(self, plan: StepPlan) -> RunnerOutput:
        assert not plan.is_empty, "the engine passed an empty plan"
        self.plans.append(plan)
        self._housekeep(plan)
        used = sum(owner is not None for owner in self.rows)
        assert all(owner is None for owner in self.rows[used:]), f"rows not compacted: {self.rows}"
        slots = plan.decode_slots
        if self.subsets:
            assert list(slots) == sorted(set(slots)) and all(0 <= slot < used for slot in slots), slots
            assert {item.slot for item in plan.prefills} <= set(slots), "a prefilled row does not decode"
        else:
            assert slots == tuple(range(used)), f"decode slots {slots} are not all {used} rows"
        owners = tuple(self.rows[slot] for slot in slots)
        assert owners == plan.request_ids, f"rows {self.rows} vs plan {plan.decode_slots} {plan.request_ids}"
        assert tuple(self.state[rid] for rid in plan.request_ids) == plan.step_indices
        if self.delay:
            time.sleep(self.delay)
        if self.fail(plan):
            raise RuntimeError("injected runner failure")
        return self._output(plan)

    def _housekeep(self, plan: StepPlan) -> None:
        freed = {slot for slot, owner in enumerate(self.rows) if owner in plan.released}
        for rid in plan.released:
            self.state.pop(rid, None)
            self.blocks.pop(rid, None)
            self.rows = [None if owner == rid else owner for owner in self.rows]
        for move in plan.moves:
            # A session moved and then released before this step leaves a move whose source was
            # freed by this plan: copying that stale row is harmless, its destination is refilled.
            assert self.rows[move.src] is not None or move.src in freed, (move, self.rows)
            assert self.rows[move.dst] is None, (move, self.rows)
            self.rows[move.dst], self.rows[move.src] = self.rows[move.src], None
        for item in plan.prefills:
            assert self.rows[item.slot] is None, f"double allocation of slot {item.slot}: {self.rows}"
            assert item.request_id not in self.state, f"{item.request_id} prefilled twice"
            self.rows[item.slot] = item.request_id
            self.state[item.request_id] = 0
            held = {block for blocks in self.blocks.values() for block in blocks}
            assert not held & set(item.blocks), f"blocks {item.blocks} of {item.request_id} are still in use"
            assert item.prepared.payload == item.request_id, "the prefill does not carry what prepare made"
            assert 0 not in item.blocks and len(item.blocks) * self.block_size >= item.prepared.kv_positions
            assert max(item.blocks, default=0) < self.num_kv_blocks
            self.blocks[item.request_id] = item.blocks

    def _output(self, plan: StepPlan) -> RunnerOutput:
        caps: dict[str, int] = {}
        errors: dict[str, str] = {}
        for item in plan.prefills:
            error = self.prefill_error(item.request)
            if error is None:
                caps[item.request_id] = self.length_cap(item.request)
            else:
                errors[item.request_id] = error
        for rid, i in zip(plan.request_ids, plan.step_indices, strict=True):
            error = errors.get(rid) or self.row_error(rid, i)
            if error is not None:
                errors[rid] = error
        audio = tuple(
            EMPTY_AUDIO if rid in errors else fake_chunk(rid, i)
            for rid, i in zip(plan.request_ids, plan.step_indices, strict=True)
        )
        stops = tuple(self.stop(rid, i) for rid, i in zip(plan.request_ids, plan.step_indices, strict=True))
        for rid in plan.request_ids:
            self.state[rid] += 1
        return RunnerOutput(audio, stops, caps, errors)


@dataclass
class RealtimeFakeRunner(FakeRunner):
    """A ``RealtimeRunner``: decodes any subset of rows and states a step cost and a chunk duration."""

    subsets: bool = True
    step_cost: StepCost = field(default_factory=lambda: StepCost.parse("4ms+1ms/row+0.1ms/token"))
    chunk_seconds: float = 0.16


def new_request(
    rid: str,
    text: str = "hello world",
    *,
    playback_lead_s: float | None = None,
    playback_due: float | None = None,
    playback_speed: float = 1.0,
    max_ahead_s: float | None = None,
    priority: Priority = Priority.REALTIME,
    **params: object,
) -> Request:
    synthesis = SynthesisParams(**params)  # type: ignore[arg-type]
    return Request(
        rid, text, synthesis,
        playback_lead_s=playback_lead_s, playback_due=playback_due, playback_speed=playback_speed,
        max_ahead_s=max_ahead_s, priority=priority,
    )  # fmt: skip


def build_engine(config: dict[str, object] | None = None, **runner_kwargs: object) -> tuple[Engine, FakeRunner]:
    """An engine around a fresh FakeRunner; ``max_running`` defaults to the runner's slot count."""
    runner = FakeRunner(**runner_kwargs)  # type: ignore[arg-type]
    engine = Engine(runner, EngineConfig(**{"max_running": runner.num_slots, **(config or {})}))  # type: ignore[arg-type]
    return engine, runner


def build_realtime_engine(
    cost: str = "4ms+1ms/row+0.1ms/token", config: dict[str, object] | None = None, **runner_kwargs: object
) -> tuple[Engine, RealtimeFakeRunner]:
    """An engine with the real-time policy around a fresh ``RealtimeFakeRunner`` of step cost ``cost``."""
    runner = RealtimeFakeRunner(step_cost=StepCost.parse(cost), **runner_kwargs)  # type: ignore[arg-type]
    settings = {"max_running": runner.num_slots, "realtime": True, **(config or {})}
    return Engine(runner, EngineConfig(**settings)), runner  # type: ignore[arg-type]


# Test modules cannot import this file (pytest's importlib mode), so the helpers travel as fixtures.


@pytest.fixture
def tts(tiny_tts: VoxCPM) -> VoxCPM:
    """The real (tiny) model of the tests that run one: the session's (tests/conftest.py)."""
    return tiny_tts


@pytest.fixture
def make_engine() -> Callable[..., tuple[Engine, FakeRunner]]:
    return build_engine


@pytest.fixture
def make_realtime_engine() -> Callable[..., tuple[Engine, RealtimeFakeRunner]]:
    return build_realtime_engine


@pytest.fixture
def make_request() -> Callable[..., Request]:
    return new_request


@pytest.fixture
def chunk_of() -> Callable[[str, int], Audio]:
    return fake_chunk


@pytest.fixture
def emulated_graph_capture(monkeypatch: pytest.MonkeyPatch) -> None:
    """``StepGraphs`` capture emulated on CPU: recording must not change the runner's pool, and a replay
    re-runs the step on whatever the buffers hold then, as a real graph would."""
    from voxwire.engine.cuda_graphs import StepGraphs

    def fake_capture(self: StepGraphs, bucket: int, timesteps: int) -> tuple[Callable[[], None], object]:
        runner = self.step.__self__  # type: ignore[attr-defined]
        pool = [
            runner.pool.base.tensor,
            runner.pool.residual.tensor,
            *runner.state.as_tuple(),
            *runner.vae_state.buffers,
        ]
        saved = [t.clone() for t in pool]
        output = self.step(bucket, timesteps)
        for tensor, value in zip(pool, saved, strict=True):
            tensor.copy_(value)

        def replay() -> None:
            output.copy_(self.step(bucket, timesteps))

        return replay, output

    monkeypatch.setattr(StepGraphs, "_capture", fake_capture)
