"""``EngineLoop``: the serving cycle of one ``Engine``, shared by every driver that serves it.

A driver owns the I/O: how it waits (a condition variable in ``AsyncEngine``'s thread, a ZeroMQ poll in an
engine process of ``voxwire serve --workers N``), how commands reach the engine between steps, and where the
outputs go. This module owns the rest of the cycle, once: when a step is due (``wait_s``), the step itself,
the load snapshot taken after it (``EngineStats``), the order in which its outputs are handed over (a stream's
first chunk before the chunks of streams already playing: ``_first_chunks_first``), and the moment the chunks
count as sent (``Engine.mark_sent``), which starts their listeners' playback clocks. Not thread-safe: call it
from the one thread that owns the engine.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from voxwire.chunk import Chunk
from voxwire.engine.engine import Engine
from voxwire.engine.errors import OverBudgetError
from voxwire.engine.latency import NO_LATENCIES, LatencyHistogram
from voxwire.engine.request import Priority, Request

Deliver = Callable[[list[Chunk]], None]
"""Hands one step's outputs (never empty) to their consumers; ``EngineLoop.stats`` is already this step's."""


@dataclass(frozen=True, slots=True)
class EngineStats:
    """A snapshot of the engine's load, taken by the engine's thread after each step (for metrics)."""

    running: int = 0
    """Requests holding a slot."""
    waiting: int = 0
    """Requests queued for a slot."""
    step_times: LatencyHistogram = NO_LATENCIES
    """Wall time of each step run since start."""
    kv_blocks_used: int = 0
    """KV blocks held by running requests."""
    kv_blocks_total: int = 0
    """KV blocks in the pool."""
    graph_captures: int = 0
    """CUDA graphs the runner has captured since start (all before serving, when it captures up front)."""
    graph_capture_seconds: float = 0.0
    """Wall time those captures took (warm-up runs included): most of the time to ``/ready`` on CUDA."""
    queue_waits: LatencyHistogram = NO_LATENCIES
    """Per request admitted since start: from ``EngineLoop.add`` to the start of the step that admitted it (the
    step that produced its first audio)."""
    step_cost_ratio: float | None = None
    """The real-time policy's measured step time over its start-up fit's prediction (``TrackedStepCost.slowdown``);
    None without the real-time policy."""
    step_load_s: float = 0.0
    """The predicted duration of a step decoding every committed stream once, at the measured cost
    (``Engine.step_load_s``)."""
    step_budget_s: float | None = None
    """The most that step may take before new streams are refused (inf: none is; ``engine.policy``, rule 7); None
    without the real-time policy."""
    sessions_shed: int = 0
    """New streams refused by that budget since start."""
    batch_running: int = 0
    """Of the requests holding a slot, those of ``Priority.BATCH``."""
    batch_waiting: int = 0
    """Of the requests queued for a slot, those of ``Priority.BATCH``."""
    realtime_rows: int = 0
    """Rows of real-time requests decoded since start (over all steps; per step: over ``steps``)."""
    batch_rows: int = 0
    """Rows of batch requests decoded since start."""

    @property
    def steps(self) -> int:
        """Steps run since start."""
        return self.step_times.count


class EngineLoop:
    """Runs ``engine``'s steps when they are due and hands their outputs to ``deliver``."""

    def __init__(self, engine: Engine, deliver: Deliver, clock: Callable[[], float] = time.monotonic) -> None:
        """``clock``: seconds on the engine's clock (``step(now)`` and ``mark_sent(now)`` read it)."""
        self.engine = engine
        self._deliver = deliver
        self._clock = clock
        self._playing: set[str] = set()
        """Requests that have had an output but not their final one: their next output is not their first."""
        self.stats = _stats_before_steps(engine)
        """The load after the most recent step; replaced whole, so a reader on any thread sees one snapshot."""
        self._queued_at: dict[str, float] = {}
        """When each request not yet admitted was added (on ``clock``)."""

    def add(self, request: Request) -> None:
        """``Engine.add`` (same errors), noting when the request started to wait for its slot."""
        try:
            self.engine.add(request)
        except OverBudgetError:
            self.stats = replace(self.stats, sessions_shed=self.engine.sessions_shed)  # seen before the next step
            raise
        self._queued_at[request.request_id] = self._clock()

    def wait_s(self) -> float:
        """Seconds until a step is due: 0 or less when one is due now, ``inf`` while only a new request (or an
        abort) can give the engine work. Under the real-time policy a step may be due only later (every stream
        far enough ahead of its listener): the driver waits for commands until then instead of spinning."""
        now = self._clock()
        return self.engine.next_step_at(now) - now

    def run_due(self) -> bool:
        """Run one step if one is due (``wait_s``); whether it ran."""
        if self.wait_s() > 0:
            return False
        self._step()
        return True

    def drain(self) -> None:
        """Abort every request and step until the engine has nothing left to do: every stream gets its final
        (``aborted``) output, and the runner its last housekeeping."""
        self.engine.abort_all()
        while self.engine.has_work():
            self._step()

    def _waits_ended(self, outputs: Iterable[Chunk], started: float) -> LatencyHistogram:
        """The queue waits with those that the step begun at ``started`` ended, each also stamped on its
        request's output (``Chunk.queued_s``). A request's first output with audio ends its wait (the step that
        admits a request decodes it); one without (aborted while waiting, failed at prefill) was never served
        and is no wait."""
        waits = self.stats.queue_waits
        for output in outputs:
            queued_at = self._queued_at.pop(output.request_id, None)
            if queued_at is not None and output.audio.size:
                output.queued_s = max(0.0, started - queued_at)
                waits = waits.observe(output.queued_s)
        return waits

    def _first_chunks_first(self, outputs: Iterable[Chunk]) -> list[Chunk]:
        """One step's outputs in delivery order: every stream's first output, then the others, each group in
        the engine's order (a stream has at most one output per step, so its own order is kept). A driver
        hands a batch over in order, and the time to first audio is the latency a listener notices, while a
        stream already playing is a chunk ahead of its player."""
        first: list[Chunk] = []
        rest: list[Chunk] = []
        for output in outputs:
            rid = output.request_id
            (rest if rid in self._playing else first).append(output)
            if output.finished:
                self._playing.discard(rid)
            else:
                self._playing.add(rid)
        return first + rest

    def _step(self) -> None:
        started = self._clock()
        outputs = self.engine.step(started)
        seconds = self._clock() - started
        self.engine.step_took(seconds)
        # Stats first: a consumer woken by these outputs must see the load after this step.
        waits = self._waits_ended(outputs, started) if outputs and self._queued_at else self.stats.queue_waits
        self.stats = _stats_after_step(self.engine, self.stats, seconds, waits)
        if outputs:
            self._deliver(self._first_chunks_first(outputs))
        # The chunks are handed over now: the listeners' playback clocks start here.
        self.engine.mark_sent(self._clock())


def _stats_before_steps(engine: Engine) -> EngineStats:
    """The snapshot before the first step: the pool's size and the graphs captured while the runner was made."""
    runner = engine.runner
    return EngineStats(
        kv_blocks_total=engine.kv_blocks_total,
        graph_captures=runner.graph_captures,
        graph_capture_seconds=runner.graph_capture_seconds,
        step_cost_ratio=engine.step_cost_ratio,
        step_budget_s=engine.step_budget_s,
    )


def _stats_after_step(engine: Engine, last: EngineStats, seconds: float, waits: LatencyHistogram) -> EngineStats:
    """The load after a step of ``seconds`` that followed the snapshot ``last`` and ended the queue waits in
    ``waits``."""
    return EngineStats(
        engine.num_running,
        engine.num_waiting,
        last.step_times.observe(seconds),
        engine.kv_blocks_used,
        engine.kv_blocks_total,
        engine.runner.graph_captures,
        engine.runner.graph_capture_seconds,
        waits,
        engine.step_cost_ratio,
        engine.step_load_s,
        engine.step_budget_s,
        engine.sessions_shed,
        engine.num_running_batch,
        engine.num_waiting_batch,
        engine.rows_decoded[Priority.REALTIME],
        engine.rows_decoded[Priority.BATCH],
    )
