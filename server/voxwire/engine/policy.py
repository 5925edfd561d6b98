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
   runner's ``StepCost`` over its decode rows and prefill tokens. A row counts as what its timestep count
   costs, in rows at the default count (the runner's ``row_weight``, when it states one): a session asking
   for 50 CFM timesteps takes the room of about five.
3. *Due rows always run.* A session with slack up to ``2 * chunk_s`` (skipped now, its next chance
   ends one more step later, and it would run late) decodes this step whatever the budget: skipping
   it would guarantee a late chunk, so overload shows as longer steps, not as starved streams.
4. *Admission.* The waiting queue is FIFO: requests are admitted in order while a slot (and the
   scheduler's KV blocks) is free and the step's estimated cost stays within the budget; nothing
   overtakes one that does not fit, and the head is admitted whenever a slot is free (no
   starvation). An admitted session decodes in the step that admits it, so its first chunk comes
   with that step.
5. *Rows ahead yield first.* The other running sessions join in order of slack, least first (FIFO by
   arrival among equal slack), while the cost stays within the budget and their slack is at most
   ``max_ahead_s``. The walk stops at the first that does not fit, so the decoded running sessions
   are always a prefix of the slack order: a session further ahead never decodes while one that is
   behind it skips. Rows more than ``max_ahead_s`` ahead skip anyway: steps stay short (a new
   session's first chunk waits for less) and a barge-in discards less audio.
6. *No starvation.* A skipped session's slack shrinks as time passes, so it reaches rule 3 within
   ``max_ahead_s`` and then decodes every step until it is ahead again.
7. *Shedding.* With ``max_step_load`` set (the server's ``--max-step-load``), a request that starts a new stream
   (no ``playback_due``; a continuing sentence belongs to a stream already playing and is never shed) is refused
   when it arrives (``OverBudgetError``: busy, retry later) if streams are committed and a step decoding every
   committed stream and it once would take longer than the *step budget*, ``max_step_load * chunk_s``. The
   committed streams are the running ones and the waiting ones the free slots will take (one waiting for a slot
   replaces a stream that ends). A stream counts as its row weight times its listener's playback speed: the rows
   it needs per chunk duration. Whichever rows a step skips, every stream needs that many on average, so a batch
   whose full step is over budget makes every listener underrun; refusing the newcomer keeps the live streams on
   time. Prefill is left out (paid once, the listeners' buffers absorb it), and with nothing committed a request
   is never shed: the engine learns how fast it runs only by running.

The cost of rules 2-5 and 7 is the measured one (``cost_model.TrackedStepCost``): the start-up fit, scaled by how
much slower the machine's steps run now.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import repeat

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
class RealtimeDecision:
    """One step's choice: admit the first ``admit`` waiting requests and decode these running ones."""

    admit: int
    decode: tuple[int, ...]
    """Indices into the ``deadlines`` given to ``RealtimePolicy.decide``, in ascending order."""


@dataclass(frozen=True, slots=True)
class RealtimePolicy:
    """The real-time rules of this module's docstring, for one runner's cost and chunk duration."""

    cost: CostModel
    """The estimate of a step's duration: the runner's ``StepCost``, as the engine tracks it (``TrackedStepCost``)."""
    chunk_s: float
    """Seconds of audio per chunk: the real-time budget of one step."""
    max_ahead_s: float
    """Sessions with more slack than this skip the step even when the budget would fit them."""
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

    def sheds(self, committed: float, new: float) -> bool:
        """Rule 7: whether a new stream that needs ``new`` rows per chunk is refused while the committed streams
        need ``committed`` (0: none is committed)."""
        return committed > 0 and self.cost.seconds(committed + new) > self.step_budget_s

    @property
    def due_within_s(self) -> float:
        """Rule 3: slack up to this and a session decodes whatever the budget."""
        return 2 * self.chunk_s

    def runs_from(self, deadline: float) -> float:
        """The earliest time a session with this deadline decodes in a step that has nothing else to do."""
        if self.fits(1, 0):
            return deadline - max(self.max_ahead_s, self.due_within_s)
        return deadline - self.due_within_s  # one row alone is over budget: it runs only once due

    def fits(self, rows: float, prefill_tokens: int) -> bool:
        return self.cost.seconds(rows, prefill_tokens) <= self.chunk_s

    def weight(self, timesteps: int) -> float:
        """The rows a row asking for ``timesteps`` CFM timesteps costs (rule 2)."""
        return 1.0 if self.row_weight is None else self.row_weight(timesteps)

    def weights(self, timesteps: Iterable[int]) -> list[float] | None:
        """The rows each of these timestep counts costs (rule 2); None when every row costs one."""
        return None if self.row_weight is None else [self.weight(count) for count in timesteps]

    def decide(
        self,
        now: float,
        deadlines: Sequence[float],
        waiting_tokens: Iterable[int],
        free_slots: int,
        weights: Sequence[float] | None = None,
        waiting_weights: Iterable[float] | None = None,
    ) -> RealtimeDecision:
        """Apply rules 3-5.

        Args:
            now: The current time, on the clock the deadlines are on.
            deadlines: Per running session, its next chunk's deadline, in arrival (FIFO) order.
            waiting_tokens: The prompt positions of each waiting request, queue head first.
            free_slots: How many waiting requests, from the head, have a slot and KV blocks free.
            weights: Per running session (as ``deadlines``), the rows its row costs (``weights``); default 1.
            waiting_weights: The same for each waiting request (as ``waiting_tokens``); default 1.
        """
        weight = weights.__getitem__ if weights is not None else lambda index: 1.0
        # Stable sort: equal deadlines keep arrival order.
        order = sorted(range(len(deadlines)), key=deadlines.__getitem__)
        due = 0
        # Written as "deadline - threshold <= now" everywhere, so that the time runs_from names is
        # exactly the time the row runs, float rounding included.
        while due < len(order) and deadlines[order[due]] - self.due_within_s <= now:
            due += 1
        rows, tokens, admit = sum(weight(index) for index in order[:due]), 0, 0
        for request_tokens, row in zip(
            waiting_tokens, repeat(1.0) if waiting_weights is None else waiting_weights, strict=False
        ):
            if admit == free_slots or (admit > 0 and not self.fits(rows + row, tokens + request_tokens)):
                break
            admit += 1
            rows += row
            tokens += request_tokens
        end = due
        while (
            end < len(order)
            and deadlines[order[end]] - self.max_ahead_s <= now
            and self.fits(rows + weight(order[end]), tokens)
        ):
            rows += weight(order[end])
            end += 1
        return RealtimeDecision(admit, tuple(sorted(order[:end])))
