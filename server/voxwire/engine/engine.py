"""``Engine``: the synchronous, sans-I/O core of the streaming micro-batcher.

One ``step(now)`` is schedule → execute → update: the scheduler plans the step, the runner runs it
as one batched forward pass, and the engine turns the runner's raw output into one ``Chunk``
per session, applying the finish rule. No asyncio, sockets, threads or torch here: ``AsyncEngine``
drives this class from its own thread, and tests drive it with a fake runner. Time is an argument:
``step(now)`` and ``mark_sent(now)`` take it from the caller's clock (a virtual one in the simulator), and so does
``step_took(seconds)``, how long the last step took, which the real-time policy's cost model follows. The one clock
read here is the host's wall clock that times each step for its outputs (``Chunk.step``): it is reported, never
decides anything.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import numpy as np

from voxwire.chunk import EMPTY_AUDIO, Chunk, EngineStep
from voxwire.engine.blocks import BlockAllocator
from voxwire.engine.cost_model import TrackedStepCost
from voxwire.engine.engine_config import EngineConfig
from voxwire.engine.outputs import (
    PersonaRunner,
    RealtimeRunner,
    Runner,
    RunnerOutput,
    StepPlan,
    TimestepWeightedRunner,
)
from voxwire.engine.policy import RealtimePolicy
from voxwire.engine.request import FINISH_REASONS, Priority, Request, RequestRecord, RequestStatus
from voxwire.engine.scheduler import Scheduler
from voxwire.errors import InvalidInputError
from voxwire.finish_reason import FinishReason

logger = logging.getLogger(__name__)


class Engine:
    """Serves many synthesis requests at once, one patch per running session per ``step()``.

    Not thread-safe: exactly one thread may call its methods. A failure of the runner fails only
    the sessions it concerns (see ``Runner``); an exception escaping ``step()`` is a bug here.
    """

    def __init__(self, runner: Runner, config: EngineConfig | None = None) -> None:
        self.config = config if config is not None else EngineConfig()
        if self.config.max_running > runner.num_slots:
            raise ValueError(
                f"EngineConfig.max_running={self.config.max_running} is invalid: "
                f"the runner has only {runner.num_slots} slots"
            )
        self.runner = runner
        blocks = BlockAllocator(runner.num_kv_blocks, runner.block_size)
        realtime = _realtime_policy(runner, self.config)
        self.cost_model = None if realtime is None else realtime[0]
        """The real-time policy's cost model, following the steps' measured times (``step_took``); None without it."""
        policy = None if realtime is None else realtime[1]
        self.scheduler = Scheduler(self.config, blocks, policy, _persona_slots(runner))
        # Sessions whose first chunk the last step produced, until mark_sent stamps them.
        self._unsent: list[RequestRecord] = []
        # The last step's model work, (weighted decode rows, prefill positions, the rows' timestep counts), until
        # step_took times it.
        self._untimed: tuple[float, int, tuple[int, ...]] | None = None
        self.rows_decoded = dict.fromkeys(Priority, 0)
        """Rows decoded since start, by the priority of their requests (what each class got of the steps)."""

    def add(self, request: Request) -> None:
        """Queue ``request``, laid out by the runner now (``Runner.prepare``), once; its outputs appear in later
        ``step()`` results.

        Raises:
            ValueError: a synthesis parameter is outside ``config.limits`` (the message names it).
            InvalidInputError: the request can reach more KV positions than the whole pool holds.
            DuplicateRequestError: the id is in use by an unfinished request.
            QueueFullError: the waiting queue is full, or (``OverBudgetError``) the real-time policy sheds this new
                stream (``engine.policy``, rule 7).
        """
        self.config.limits.check(request.params)
        prepared = self.runner.prepare(request)  # the request's one layout, kept until its prefill
        positions, blocks = prepared.kv_positions, self.scheduler.blocks
        if blocks.blocks_for(positions) > blocks.num_total:
            raise InvalidInputError(
                f"request {request.request_id!r} can reach {positions} KV positions but the whole KV pool holds "
                f"{blocks.num_total * blocks.block_size}: lower max_len, shorten the text, or give the KV cache "
                "more memory (--kv-cache-gb)"
            )
        self.scheduler.add(request, prepared)

    def abort(self, request_id: str) -> bool:
        """Abort a waiting or running request; its final ``aborted`` output comes with the next step.

        The slot is freed at once. Returns False (and does nothing) for an unknown or finished id.
        """
        return self.scheduler.abort(request_id)

    def abort_all(self) -> int:
        """Abort every unfinished request; returns how many were aborted."""
        return sum(self.scheduler.abort(rid) for rid in list(self.scheduler.records))

    def has_unfinished(self) -> bool:
        """Whether some request still owes its final output."""
        return self.scheduler.has_unfinished()

    def has_work(self) -> bool:
        """Whether ``step()`` would do anything: unfinished requests or runner housekeeping."""
        return self.scheduler.has_unfinished() or self.scheduler.has_housekeeping()

    def next_step_at(self, now: float) -> float:
        """When ``step`` would next do any work (``now`` if it would now; ``inf`` if only new requests
        can give it some): under the real-time policy, sessions far enough ahead of their listeners
        make a step idle, and the caller should sleep until then rather than spin."""
        return self.scheduler.next_step_at(now)

    @property
    def num_running(self) -> int:
        return self.scheduler.slots.num_used

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    @property
    def num_running_batch(self) -> int:
        """Of the running requests, the batch ones."""
        records = self.scheduler.records
        return sum(records[rid].is_batch for rid in self.scheduler.slots.owners)

    @property
    def num_waiting_batch(self) -> int:
        """Of the waiting requests, the batch ones."""
        return sum(record.is_batch for record in self.scheduler.waiting)

    @property
    def num_free_slots(self) -> int:
        return self.scheduler.slots.num_free

    @property
    def kv_blocks_used(self) -> int:
        return self.scheduler.blocks.num_used

    @property
    def kv_blocks_total(self) -> int:
        return self.scheduler.blocks.num_total

    @property
    def sessions_shed(self) -> int:
        """New streams refused by the real-time step budget since start (``engine.policy``, rule 7)."""
        return self.scheduler.sessions_shed

    @property
    def step_cost_ratio(self) -> float | None:
        """The measured step time over the start-up fit's prediction (``TrackedStepCost.slowdown``); None without
        the real-time policy."""
        return None if self.cost_model is None else self.cost_model.slowdown

    @property
    def step_load_s(self) -> float:
        """The predicted duration of a step decoding every committed stream once, at the measured cost (what rule 7
        compares with ``step_budget_s``); 0 when none is committed or without the real-time policy."""
        policy, (committed, timesteps) = self.scheduler.realtime, self.scheduler.committed_load()
        return 0.0 if policy is None or not committed else policy.cost.seconds(committed, 0, timesteps)

    @property
    def step_budget_s(self) -> float | None:
        """Rule 7's step budget (inf: no stream is shed); None without the real-time policy."""
        policy = self.scheduler.realtime
        return None if policy is None else policy.step_budget_s

    def step_took(self, seconds: float) -> None:
        """The last ``step`` took ``seconds`` on the caller's clock: the real-time cost model learns from it (call it
        after each step; a step that ran no model work, or none since the last call, teaches nothing).

        Raises:
            ValueError: ``seconds`` is not a finite number >= 0.
        """
        work, self._untimed = self._untimed, None
        if work is not None and self.cost_model is not None:
            rows, tokens, timesteps = work
            self.cost_model.observe(rows, tokens, seconds, timesteps)

    def step(self, now: float | None = None) -> list[Chunk]:
        """Run one batched step; return the outputs it produced, at most one per request.

        ``now`` is when the step starts, on the caller's clock; the real-time policy requires it.
        """
        if self.scheduler.realtime is not None and now is None:
            raise ValueError("EngineConfig.realtime schedules by the clock: call step(now)")
        started_ns = time.time_ns()
        self._unsent.clear()  # mark_sent applies to the last step only; unmarked first chunks stay due
        self._untimed = None
        outputs = [Chunk(s.request_id, EMPTY_AUDIO, FinishReason.ABORTED) for s in self.scheduler.take_aborted()]
        outputs += [
            Chunk(s.request_id, EMPTY_AUDIO, FinishReason.BUSY, self._busy_message(s))
            for s in self.scheduler.take_expired(now)
        ]
        plan = self.scheduler.schedule(now)
        if plan.is_empty:
            return outputs
        rows = [self.scheduler.records[rid] for rid in plan.request_ids]
        try:
            result = self.runner.execute(plan)
            _check_output(plan, result)
        except Exception as exc:
            # TGI's rule: after a failed forward pass no row's state can be trusted, including the
            # rows that skipped this step.
            holding = [self.scheduler.records[rid] for rid in self.scheduler.slots.owners]
            logger.exception("runner failed a step of %d sessions (%d holding rows)", len(rows), len(holding))
            return outputs + self._fail(holding, f"runner failed: {type(exc).__name__}: {exc}")
        step = EngineStep(started_ns, time.time_ns() - started_ns, len(rows))
        batch_rows = sum(record.is_batch for record in rows)
        self.rows_decoded[Priority.BATCH] += batch_rows
        self.rows_decoded[Priority.REALTIME] += len(rows) - batch_rows
        if rows or plan.prefills:
            tokens = sum(item.prepared.prompt_positions for item in plan.prefills)
            counts = tuple({record.request.params.inference_timesteps for record in rows})
            self._untimed = (sum(record.row_weight for record in rows), tokens, counts)
        return outputs + self._update(plan, rows, result, step)

    def mark_sent(self, now: float) -> None:
        """The outputs of the last ``step`` left at ``now``: first chunks start their listeners' clocks.

        Call it after each step (the real-time policy treats a first chunk not yet marked as due now).
        """
        for record in self._unsent:
            record.first_sent_at = now
        self._unsent.clear()

    def _busy_message(self, record: RequestRecord) -> str:
        wait = record.persona_wait
        why = f" ({wait.value})" if wait is not None else ""
        return (
            f"request {record.request_id!r} waited {self.config.max_persona_wait_s:g} s for a slot for persona "
            f"{record.request.persona!r} and got none{why}; retry later"
        )

    def _fail(self, rows: list[RequestRecord], message: str) -> list[Chunk]:
        self.scheduler.finish((record, RequestStatus.FINISHED_ERROR) for record in rows)
        return [Chunk(s.request_id, EMPTY_AUDIO, FinishReason.ERROR, message) for s in rows]

    def _update(self, plan: StepPlan, rows: list[RequestRecord], result: RunnerOutput, step: EngineStep) -> list[Chunk]:
        for rid, cap in result.length_caps.items():
            self.scheduler.records[rid].length_cap = cap
        outputs: list[Chunk] = []
        finished: list[tuple[RequestRecord, RequestStatus]] = []
        patches = result.patches or (None,) * len(rows)
        errors, running = result.errors, RequestStatus.RUNNING
        # The per-row loop is the engine's host cost per step: kept to a few attribute reads per row.
        for record, rid, audio, stop_flag, patch in zip(
            rows, plan.request_ids, result.audio, result.stop_flags, patches, strict=True
        ):
            error = errors.get(rid) if errors else None
            if error is not None:
                finished.append((record, RequestStatus.FINISHED_ERROR))
                outputs.append(Chunk(rid, EMPTY_AUDIO, FinishReason.ERROR, error, None, None, step))
                continue
            status = record.status_after(stop_flag)
            # A stream's first chunk reports its prompt's size (the SSE ``usage``): the frontends never measure it.
            prompt = None
            if record.step_index == 0:
                self._unsent.append(record)
                prompt = record.prepared.prompt_positions
            record.step_index += 1
            if status is running:
                outputs.append(Chunk(rid, audio, None, None, patch, None, step, prompt))
            else:
                finished.append((record, status))
                outputs.append(Chunk(rid, audio, FINISH_REASONS[status], None, patch, None, step, prompt))
        self.scheduler.finish(finished)
        return outputs


def _realtime_policy(runner: Runner, config: EngineConfig) -> tuple[TrackedStepCost, RealtimePolicy] | None:
    """The real-time policy of ``config`` over ``runner``, with the cost model it budgets by; None without it."""
    if not config.realtime:
        return None
    if not isinstance(runner, RealtimeRunner):
        raise ValueError(
            f"EngineConfig.realtime needs a runner that states its step cost (step_cost, chunk_seconds); "
            f"{type(runner).__name__} does not"
        )
    cost = TrackedStepCost(runner.step_cost)
    row_weight = runner.row_weight if isinstance(runner, TimestepWeightedRunner) else None
    return cost, RealtimePolicy(cost, runner.chunk_seconds, config.max_ahead_s, row_weight, config.max_step_load)


def _persona_slots(runner: Runner) -> Callable[[], int | None]:
    """The runner's persona slots as the scheduler reads them, now (None: it states no bound)."""
    if isinstance(runner, PersonaRunner):
        return lambda: runner.persona_slots
    return lambda: None


def _check_output(plan: StepPlan, result: RunnerOutput) -> None:
    """Raise if ``result`` breaks the ``RunnerOutput`` contract for ``plan`` (treated as a runner failure)."""
    rows = len(plan.request_ids)
    if len(result.audio) != rows or len(result.stop_flags) != rows or len(result.patches) not in (0, rows):
        got = f"{len(result.audio)} and {len(result.stop_flags)}"
        raise RuntimeError(f"expected {rows} audio arrays and stop flags (one per decode row), got {got}")
    prefilled = {item.request_id for item in plan.prefills}
    caps, errors = set(result.length_caps), set(result.errors)
    unanswered = prefilled - caps - errors
    if unanswered or not caps <= prefilled or not errors <= set(plan.request_ids):
        got = f"length caps for {sorted(caps)} and errors for {sorted(errors)}"
        raise RuntimeError(f"{got} do not match the prefills {sorted(prefilled)}")
    if any(not isinstance(cap, int) or cap < 1 for cap in result.length_caps.values()):
        raise RuntimeError(f"length caps must be ints >= 1, got {result.length_caps}")
    for rid, audio in zip(plan.request_ids, result.audio, strict=True):
        if rid not in result.errors and (audio.ndim != 1 or audio.dtype != np.float32):
            raise RuntimeError(f"audio of {rid!r} must be 1-D float32, got shape {audio.shape} dtype {audio.dtype}")
