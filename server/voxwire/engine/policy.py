"""Who runs in a step: the engine's two scheduling policies, as pure functions of what they are given.

Sans-I/O: no clock is read here. Time comes in as ``now``, on whatever clock the caller drives the
engine with (``time.monotonic()`` in the server, a virtual clock in ``scripts/simulate_load.py``).

**FIFO** (``admit_count``; the default, for runners that do not state a step cost). Every running
session decodes every step. Admission walks the waiting queue in order while a slot is free and the
prefill tokens stay within ``max_prefill_tokens_per_step``; the head is admitted whenever a slot is
free, and nothing overtakes a request that does not fit.

**Real-time** (``RealtimePolicy``; ``EngineConfig.realtime``). Audio has a deadline, so the rules are:

1. *Playback deadline.* A session's listener starts playing at ``start`` = the time its first chunk
   left plus its lead (the lead the client announced, else the server's default), or, for a sentence
   continuing a stream that is already playing, the request's ``playback_due``. Chunk ``k`` is due at
   ``start + k * chunk_s / playback_speed`` (a listener playing faster, ``Request.playback_speed``, drains
   its buffer sooner). A session's *slack* is its next chunk's deadline minus ``now``: how much
   audio its listener still has buffered. A first chunk produced but not yet marked sent has no start
   yet and counts as due now (slack -inf).
2. *Real-time budget.* A step should take at most one chunk duration ``chunk_s``, as estimated by the
   runner's ``StepCost`` over its decode rows and prefill tokens, and should not end after the earliest
   deadline of a row it must run (rule 3) when rows it merely may run make it longer: the *step limit* is
   ``min(chunk_s, earliest finite deadline of a must-run row - now)``. A row counts as what its timestep count
   costs, in rows at the default count (the runner's ``row_weight``, when it states one): a session asking
   for 50 CFM timesteps takes the room of about five.
3. *Due rows always run.* A session with slack up to ``2 * chunk_s`` (skipped now, its next chance
   ends one more step later, and it would run late) decodes this step whatever the budget: skipping
   it would guarantee a late chunk, so overload shows as longer steps, not as starved streams.
4. *Admission.* The waiting queue is FIFO: requests are admitted in order while a slot (and the
   scheduler's KV blocks) is free and the step's estimated cost stays within the step limit; nothing
   overtakes one that does not fit, and the head is admitted whenever a slot is free (no
   starvation). An admitted session decodes in the step that admits it, so its first chunk comes
   with that step.
5. *Work-conserving, rows ahead yield first.* The step is then filled with the other running sessions, in
   order of slack, least first (FIFO by arrival among equal slack), while the cost stays within the step limit:
   an idle engine runs every row every step, a loaded one degrades to playback pacing for the rows that have
   slack. A session joins only while its slack is at most its own lead bound (``Request.max_ahead_s``, else the
   engine's ``max_ahead_s``): a WebSocket listener buffers what it gets, so its stream stays that close (a short
   step for a new session's first chunk, little audio discarded on a barge-in); an HTTP response has no bound
   (``math.inf``): its reader wants the audio as fast as it comes, and what it has not read yet waits in the
   server, at most its request's length cap. The walk passes over rows beyond their bound and stops at the first
   that does not fit, so among the rows within their bounds the decoded ones are a prefix of the slack order: a
   session further ahead never decodes while one behind it skips.
6. *No starvation.* A skipped session's slack shrinks as time passes, so it reaches rule 3 and then decodes
   every step until it is ahead again.
7. *Shedding.* With ``max_step_load`` set (the server's ``--max-step-load``), a real-time request that starts a new
   stream (no ``playback_due``; a continuing sentence belongs to a stream already playing and is never shed) is
   refused when it arrives (``OverBudgetError``: busy, retry later) if streams are committed and a step decoding
   every committed stream and it once would take longer than the *step budget*, ``max_step_load * chunk_s``. The
   committed streams are the real-time running ones and the real-time waiting ones the free slots will take (one
   waiting for a slot replaces a stream that ends). A stream counts as its row weight times its listener's playback
   speed: the rows it needs per chunk duration. Whichever rows a step skips, every stream needs that many on
   average, so a batch whose full step is over budget makes every listener underrun; refusing the newcomer keeps
   the live streams on time. Prefill is left out (paid once, the listeners' buffers absorb it), and with nothing
   committed a request is never shed: the engine learns how fast it runs only by running.

**Batch priority** (``Request.priority``: ``Priority.BATCH``, an offline job nobody listens to live). Batch requests
take only the capacity real-time ones leave, and never starve (``EngineConfig.max_batch_gap_s``, ``G``):

B1. *Queue.* Real-time waiting requests are admitted before batch ones; a batch request is admitted, in order,
    only while the step stays within the step limit and rule 7's step budget (``max_step_load * chunk_s``: the
    most the live streams' own step may grow to, so on an engine the live streams fill, batch adds nothing to their
    steps) after every real-time row of rules 3-5 is placed; the scheduler caps the slots batch requests hold
    (``EngineConfig.max_batch_running``). A step that admits a real-time request takes no batch work but what is
    due (B2): a new stream's first chunk never waits for it. A batch request that has waited ``G`` queues as a
    real-time request would have (by arrival): it is admitted when it reaches the head. Batch requests are never
    shed (rule 7 counts only real-time streams); they wait.
B2. *Rows.* A running batch row has no listener; its deadline is ``G`` after the start of its last step. Batch
    rows fill the step last, least recently decoded first, within the same bounds as B1's admissions; a batch
    row at its deadline runs whatever the budget, as a due row does.
B3. *Idle of live streams.* With no real-time stream running or admitted, batch work is not budgeted: every batch
    row decodes every step and the waiting batch requests are admitted (within the free slots and the batch cap),
    so an engine with no listener runs offline jobs at its full speed, even one whose single row is over the
    real-time budget (a CPU); a real-time request that arrives waits for at most that one step.
B4. *Guarantee.* So a running batch row decodes at least once every ``G`` (plus one step), and a waiting batch
    request waits at most ``G`` longer than a real-time one would; what the real-time rows can lose to batch is
    each running batch row's cost once per ``G`` (a step's forced batch rows), which rule 7 does not count.

The cost of rules 2-5 and 7 is the measured one (``cost_model.TrackedStepCost``): the start-up fit, scaled by how
much slower the machine's steps run now.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass

from voxwire.engine.cost_model import CostModel

DUE_NOW = -math.inf
"""The deadline of a chunk whose listener is already waiting (first chunk not yet marked sent)."""


def admit_count(prefill_tokens: Iterable[int], free_slots: int, token_budget: int) -> int:
    """FIFO admission: how many requests at the head of the waiting queue join this step.

    Admit a request while a slot is free and the prefill tokens admitted so far plus its own stay
    within ``token_budget``. The first request is admitted whenever a slot is free, even if it alone
    exceeds the budget, so a long prompt cannot starve. Stop at the first request that does not fit.

    Args:
        prefill_tokens: The prompt positions of each waiting request (``Prepared.prompt_positions``), queue head first.
        free_slots: Slots left under ``max_running`` after this step's releases.
        token_budget: ``EngineConfig.max_prefill_tokens_per_step``.
    """
    count = used = 0
    for tokens in prefill_tokens:
        if count == free_slots or (count > 0 and used + tokens > token_budget):
            break
        count += 1
        used += tokens
    return count


def playback_deadline(start: float | None, chunks_produced: int, chunk_s: float) -> float:
    """When the next chunk must have left (rule 1); ``start`` is None until the first chunk is sent."""
    return DUE_NOW if start is None else start + chunks_produced * chunk_s


@dataclass(frozen=True, slots=True)
class RunningRows:
    """The running sessions as the policy sees them: index-aligned sequences, in arrival (FIFO) order."""

    deadlines: Sequence[float]
    """A real-time row's next chunk's deadline (rule 1); a batch row's, when it must decode again (rule B2)."""
    weights: Sequence[float] | None = None
    """The rows each one's row costs (rule 2); None: one each."""
    lead_bounds: Sequence[float | None] | None = None
    """How far ahead of its listener each real-time row may run (rule 5; None or an absent sequence: the policy's
    ``max_ahead_s``; ``math.inf``: no bound)."""
    batch: frozenset[int] = frozenset()
    """The indices of the batch rows (rule B2)."""
    timesteps: Sequence[int] | None = None
    """Each one's CFM timestep count: a step holding rows of several timestep buckets runs a sub-step per bucket
    (rule 2); None: all in one bucket."""


@dataclass(frozen=True, slots=True)
class WaitingRequests:
    """The requests the free slots can take, in the order they may be admitted (a prefix is): the real-time ones
    (and batch ones that have waited ``max_batch_gap_s``) first, then the batch ones (rule B1)."""

    tokens: Sequence[int]
    """Each one's prompt positions."""
    weights: Sequence[float] | None = None
    """The rows each one's row costs (rule 2); None: one each."""
    realtime: int | None = None
    """How many, from the head, queue as real-time requests; None: all of them."""
    timesteps: Sequence[int] | None = None
    """Each one's CFM timestep count (as ``RunningRows.timesteps``)."""


@dataclass(frozen=True, slots=True)
class RealtimeDecision:
    """One step's choice: admit the first ``admit`` waiting requests and decode these running ones."""

    admit: int
    decode: tuple[int, ...]
    """Indices into the ``RunningRows`` given to ``RealtimePolicy.decide``, in ascending order."""


@dataclass(frozen=True, slots=True)
class RealtimePolicy:
    """The real-time rules of this module's docstring, for one runner's cost and chunk duration."""

    cost: CostModel
    """The estimate of a step's duration: the runner's ``StepCost``, as the engine tracks it (``TrackedStepCost``)."""
    chunk_s: float
    """Seconds of audio per chunk: the real-time budget of one step."""
    max_ahead_s: float
    """Rule 5's lead bound of a row that states none (``Request.max_ahead_s``)."""
    row_weight: Callable[[int], float] | None = None
    """What a row asking for so many CFM timesteps costs, in rows (rule 2); None: every row costs one."""
    max_step_load: float | None = None
    """Rule 7: the share of ``chunk_s`` a step of every committed stream may take before new streams are refused;
    None: none is ever refused."""

    def __post_init__(self) -> None:
        for name in ("chunk_s", "max_ahead_s"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"RealtimePolicy.{name}={value!r} is invalid: must be a finite number > 0")
        load = self.max_step_load
        if load is not None and not (load > 0 and math.isfinite(load)):
            raise ValueError(f"RealtimePolicy.max_step_load={load!r} is invalid: must be None or a finite number > 0")

    @property
    def step_budget_s(self) -> float:
        """Rule 7: the most a step of every committed stream may take before new streams are refused (inf: never)."""
        return math.inf if self.max_step_load is None else self.max_step_load * self.chunk_s

    def sheds(self, committed: float, new: float, timesteps: Collection[int] = ()) -> bool:
        """Rule 7: whether a new stream that needs ``new`` rows per chunk is refused while the committed streams
        need ``committed`` (0: none is committed); ``timesteps``: the counts they and it ask for."""
        return committed > 0 and self.cost.seconds(committed + new, 0, timesteps) > self.step_budget_s

    def substeps_s(self, timesteps: Collection[int]) -> float:
        """Rule 2: what a step whose rows ask for these timestep counts pays for its sub-steps beyond the first."""
        return self.cost.seconds(0, 0, timesteps) - self.cost.seconds(0, 0) if len(timesteps) > 1 else 0.0

    @property
    def due_within_s(self) -> float:
        """Rule 3: slack up to this and a session decodes whatever the budget."""
        return 2 * self.chunk_s

    def lead_bound(self, bound: float | None) -> float:
        """Rule 5: a row's own lead bound, or the policy's when it states none."""
        return self.max_ahead_s if bound is None else bound

    def runs_from(
        self, deadline: float, lead_bound: float | None = None, batch: bool = False, live: bool = True
    ) -> float:
        """The earliest time a row with this deadline (and lead bound, for a real-time row) decodes in a step that
        has nothing else to do (``live``: whether real-time streams run beside it)."""
        if batch:  # rules B2-B3: it fills any step (any at all with no live stream), or waits until due
            return -math.inf if not live or self.fits(1, 0, self.step_budget_s) else deadline
        if self.fits(1, 0):
            return deadline - max(self.lead_bound(lead_bound), self.due_within_s)
        return deadline - self.due_within_s  # one row alone is over budget: it runs only once due

    def fits(self, rows: float, prefill_tokens: int, limit_s: float | None = None, substeps_s: float = 0.0) -> bool:
        """Whether a step of ``rows`` and ``prefill_tokens`` (and ``substeps_s`` of sub-steps beyond the first)
        stays within ``limit_s`` (default: ``chunk_s``)."""
        limit = self.chunk_s if limit_s is None else limit_s
        return self.cost.seconds(rows, prefill_tokens) + substeps_s <= limit

    def weight(self, timesteps: int) -> float:
        """The rows a row asking for ``timesteps`` CFM timesteps costs (rule 2)."""
        return 1.0 if self.row_weight is None else self.row_weight(timesteps)

    def weights(self, timesteps: Iterable[int]) -> list[float] | None:
        """The rows each of these timestep counts costs (rule 2); None when every row costs one."""
        return None if self.row_weight is None else [self.weight(count) for count in timesteps]

    def decide(self, now: float, running: RunningRows, waiting: WaitingRequests, free_slots: int) -> RealtimeDecision:
        """Apply rules 2-5 and B1-B3.

        Args:
            now: The current time, on the clock the deadlines are on.
            running: The running sessions.
            waiting: The waiting requests the free slots could take, in admission order.
            free_slots: How many of them, from the head, have a slot and KV blocks free.
        """
        deadlines = running.deadlines
        weights, bounds, batch = running.weights, running.lead_bounds, running.batch
        weight = weights.__getitem__ if weights is not None else lambda index: 1.0
        # Stable sorts: equal deadlines keep arrival order.
        by_deadline = sorted(range(len(deadlines)), key=deadlines.__getitem__)
        live = [index for index in by_deadline if index not in batch] if batch else by_deadline
        offline = [index for index in by_deadline if index in batch] if batch else []
        # Rule 3 and B2: the rows that run whatever the budget. Written as "deadline - threshold <= now" everywhere,
        # so that the time runs_from names is exactly the time the row runs, float rounding included.
        due = 0
        while due < len(live) and deadlines[live[due]] - self.due_within_s <= now:
            due += 1
        batch_due = 0
        while batch_due < len(offline) and deadlines[offline[batch_due]] <= now:
            batch_due += 1
        decode = live[:due] + offline[:batch_due]
        rows = sum(weight(index) for index in decode)
        # Rule 2's sub-steps: the timestep counts the step holds so far, and what their extra sub-steps cost.
        row_steps, waiting_steps = running.timesteps, waiting.timesteps
        present = set() if row_steps is None else {row_steps[index] for index in decode}
        substeps = self.substeps_s(present)

        def with_count(steps: Sequence[int] | None, index: int) -> tuple[set[int], float]:
            """The counts present, and their sub-steps' cost, if the row or request ``index`` of ``steps`` joins."""
            if steps is None or steps[index] in present:
                return present, substeps
            joined = present | {steps[index]}
            return joined, self.substeps_s(joined)

        # Rule 2's step limit: the earliest deadline a must-run row has (DUE_NOW rows are late whatever runs).
        earliest = min((deadlines[index] for index in live[:due] if deadlines[index] > DUE_NOW), default=math.inf)
        limit = min(self.chunk_s, earliest - now)
        tokens_in = waiting.tokens
        waiting_weight = waiting.weights.__getitem__ if waiting.weights is not None else lambda index: 1.0
        realtime = len(tokens_in) if waiting.realtime is None else waiting.realtime
        candidates = min(free_slots, len(tokens_in))
        tokens = admit = 0

        def admit_while_fits(end: int, head_forced: bool) -> None:
            """Rule 4 / B1: admit in order while the step fits (the head, index 0, whatever the budget if forced)."""
            nonlocal admit, rows, tokens, present, substeps
            while admit < end:
                row, request_tokens = waiting_weight(admit), tokens_in[admit]
                counts, cost = with_count(waiting_steps, admit)
                forced = head_forced and admit == 0
                if not forced and not self.fits(rows + row, tokens + request_tokens, limit, cost):
                    return
                admit, rows, tokens, present, substeps = admit + 1, rows + row, tokens + request_tokens, counts, cost

        def fill(order: Sequence[int], eligible: Callable[[int], bool]) -> bool:
            """Rules 5 and B2: add the eligible rows of ``order`` while the step fits; False once one did not."""
            nonlocal rows, present, substeps
            for index in order:
                if not eligible(index):
                    continue
                counts, cost = with_count(row_steps, index)
                if not self.fits(rows + weight(index), tokens, limit, cost):
                    return False
                rows, present, substeps = rows + weight(index), counts, cost
                decode.append(index)
            return True

        admitted_live = min(realtime, candidates)
        admit_while_fits(admitted_live, head_forced=True)
        lead = [self.max_ahead_s] * len(deadlines) if bounds is None else [self.lead_bound(bound) for bound in bounds]
        live_all_placed = fill(live[due:], lambda index: deadlines[index] - lead[index] <= now)
        if live_all_placed and admit == 0:
            # Rule B1: batch requests and then batch rows only in what every real-time row left, within the step
            # budget (rule 7's), and never in a step that admits a real-time request; with no real-time stream at
            # all, whole steps (B3).
            limit = min(limit, self.step_budget_s) if live else math.inf
            admit_while_fits(candidates, head_forced=False)
            fill(offline[batch_due:], lambda index: True)
        return RealtimeDecision(admit, tuple(sorted(decode)))
