"""Which sessions the runner serves in each step, and in which rows.

The scheduler owns the bounded FIFO waiting queue, the running sessions and their slots, and the
housekeeping (released ids, slot moves) the runner must apply before the next step. Whom to admit
and whom to decode is decided by the rules of ``engine.policy``; this module applies the decision.
It does not run the model, build outputs, or decide when a stream ends: ``Engine`` does, and
reports the sessions that finished through ``Scheduler.finish``.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable
from itertools import chain, islice

from voxwire.engine.blocks import BlockAllocator
from voxwire.engine.engine_config import EngineConfig
from voxwire.engine.errors import DuplicateRequestError, OverBudgetError, QueueFullError
from voxwire.engine.outputs import PrefillItem, StepPlan
from voxwire.engine.policy import RealtimePolicy, RunningRows, WaitingRequests, admit_count, playback_deadline
from voxwire.engine.request import PersonaWait, Prepared, Priority, Request, RequestRecord, RequestStatus
from voxwire.engine.slots import SlotMove, SlotTable


class Scheduler:
    """Builds one ``StepPlan`` per step and keeps the slot table compacted.

    Requests admitted from the waiting queue are prefilled and then decoded in the same step, so a
    new session gets its first chunk in the step that admits it. Without ``realtime`` (no policy
    given) every step decodes *all* running sessions and admission is ``policy.admit_count``; with a
    ``RealtimePolicy``, ``schedule(now)`` lets sessions ahead of their listener skip the step. The
    batch never exceeds ``max_running`` rows, and at most ``max_waiting`` requests wait beyond those
    the free slots will take at the next step.

    KV blocks: a request admitted gets every block it can reach (``blocks``), and admission stops at
    the first waiting request whose blocks are not free (it waits; nothing overtakes it).

    Priorities (``Request.priority``; the rules are ``engine.policy``'s B1-B4): the free slots go to the real-time
    waiting requests first, in arrival order, then to the batch ones, which hold at most
    ``EngineConfig.max_batch_running`` slots; a batch request that has waited ``max_batch_gap_s`` takes its place
    among the real-time ones by arrival. Each class has its own ``max_waiting``, so a batch job that fills its queue
    never refuses a live request. Under ``--no-realtime`` (FIFO) the classes only order admission.

    LoRA personas (when the runner has a bounded number of persona slots, ``PersonaRunner``), the rules of
    persona admission, stated here once:

    P1. A running request holds its persona's device slot; requests of one persona share it. A waiting request
        with a persona may take a free slot only if its persona is held already or a persona slot is left
        (resident personas no running request holds are evicted for it by the runner's bank).
    P2. Its owner (``Request.owner``) may hold at most ``EngineConfig.persona_slots_per_owner`` distinct personas
        with its running requests: one client cannot take every persona slot.
    P3. A request that P1 or P2 holds back keeps its place in the queue and is passed over: it never delays
        requests behind it that can run (no persona, a held one, or one that still has a slot). When a persona
        slot frees, the earliest such request gets it. It counts against ``max_waiting`` as any waiting request.
    P4. A request held back by P1 or P2 for ``EngineConfig.max_persona_wait_s`` (on the clock ``schedule`` is
        given) leaves the queue ``FINISHED_BUSY`` (``take_expired``), a retryable refusal, never a failure.
    """

    def __init__(
        self,
        config: EngineConfig,
        blocks: BlockAllocator,
        realtime: RealtimePolicy | None = None,
        persona_slots: Callable[[], int | None] = lambda: None,
    ) -> None:
        """``persona_slots``: the runner's persona slots now (``PersonaRunner.persona_slots``; None: unbounded)."""
        if config.realtime != (realtime is not None):
            raise ValueError("EngineConfig.realtime needs a RealtimePolicy, and only it takes one")
        self.config = config
        self.blocks = blocks
        self.realtime = realtime
        self.persona_slots = persona_slots
        self._serial = 0
        self.slots = SlotTable(config.max_running)
        self.waiting: deque[RequestRecord] = deque()
        # Every request whose final output has not been emitted yet (waiting, running, aborted).
        self.records: dict[str, RequestRecord] = {}
        # Aborted since the last step; their final outputs are due at the next one.
        self._aborted: list[RequestRecord] = []
        # Housekeeping for the runner, delivered with the next plan.
        self._released: list[str] = []
        self._moves: list[SlotMove] = []
        self.sessions_shed = 0
        """New streams refused by the real-time policy's step budget (``engine.policy``, rule 7) since start."""

    def add(self, request: Request, prepared: Prepared) -> None:
        """Append ``request`` to the waiting queue, as the runner ``prepared`` it (its prompt and KV positions).

        Raises:
            DuplicateRequestError: a request with the same id has not finished yet.
            QueueFullError: ``max_waiting`` requests are already waiting beyond the free slots.
            OverBudgetError: a new stream the real-time policy sheds (``engine.policy``, rule 7).
        """
        rid = request.request_id
        if rid in self.records:
            raise DuplicateRequestError(f"request id {rid!r} is already in use by an unfinished request")
        # Requests that the next step will hand a free slot are not waiting for one: only the rest count
        # against max_waiting, so a request is never refused while a slot is free. Each priority has its own queue.
        priority = request.priority
        queued = sum(record.request.priority is priority for record in self.waiting)
        if queued >= self.config.max_waiting + self.slots.num_free:
            raise QueueFullError(
                f"request {rid!r} rejected: the {'batch ' if priority is Priority.BATCH else ''}waiting queue is full "
                f"({self.config.max_waiting} requests waiting behind {self.slots.num_used} running, no slot free)"
            )
        policy = self.realtime
        weight = 1.0 if policy is None else policy.weight(request.params.inference_timesteps)
        record = RequestRecord(request, prepared, row_weight=weight)
        if policy is not None and request.playback_due is None and priority is Priority.REALTIME:
            committed, timesteps = self.committed_load(record)
            if policy.sheds(committed, record.demand, timesteps):
                self.sessions_shed += 1
                step_ms = policy.cost.seconds(committed + record.demand, 0, timesteps) * 1e3
                raise OverBudgetError(
                    f"request {rid!r} refused: the engine is at its real-time budget (a step of its committed streams "
                    f"and this one would take {step_ms:.0f} ms, over its {policy.step_budget_s * 1e3:.0f} ms); "
                    "retry later"
                )
        self._serial += 1
        record.serial = self._serial
        self.waiting.append(record)
        self.records[rid] = record

    def committed_load(self, new: RequestRecord | None = None) -> tuple[float, set[int]]:
        """The committed streams (``engine.policy``, rule 7: the real-time running ones and the real-time waiting ones
        the free slots will take): the rows per chunk duration they need (0: none is committed), and the CFM timestep
        counts they and ``new`` ask for (their step's sub-steps, rule 2)."""
        running = (self.records[rid] for rid in self.slots.owners)
        waiting = islice((record for record in self.waiting if not record.is_batch), self.slots.num_free)
        streams = [record for record in chain(running, waiting) if not record.is_batch]
        timesteps = {record.request.params.inference_timesteps for record in streams}
        if new is not None:
            timesteps.add(new.request.params.inference_timesteps)
        return sum(record.demand for record in streams), timesteps

    def committed_demand(self) -> float:
        """The rows per chunk duration the committed streams need (rule 7); 0 when none is committed."""
        return self.committed_load()[0]

    def abort(self, request_id: str) -> bool:
        """Finish ``request_id`` as aborted, freeing its slot; False if it is unknown or finished."""
        record = self.records.get(request_id)
        if record is None or record.status.is_finished:
            return False
        if record.status is RequestStatus.WAITING:
            self.waiting.remove(record)
        else:
            self._release(record)
        record.status = RequestStatus.FINISHED_ABORTED
        self._aborted.append(record)
        return True

    def take_aborted(self) -> list[RequestRecord]:
        """The requests aborted since the last call, whose final outputs the caller now emits."""
        aborted, self._aborted = self._aborted, []
        for record in aborted:
            del self.records[record.request_id]
        return aborted

    def take_expired(self, now: float | None) -> list[RequestRecord]:
        """The waiting requests that have waited ``max_persona_wait_s`` for a persona slot by ``now`` (rule P4):
        they leave the queue ``FINISHED_BUSY``, and the caller emits their final outputs. None: no clock, none."""
        if now is None:
            return []
        bound = self.config.max_persona_wait_s
        expired = [s for s in self.waiting if s.persona_wait_since is not None and now - s.persona_wait_since >= bound]
        for record in expired:
            self.waiting.remove(record)
            record.status = RequestStatus.FINISHED_BUSY
            del self.records[record.request_id]
        return expired

    def schedule(self, now: float | None = None) -> StepPlan:
        """Admit from the waiting queue and describe this step's work (see the class docstring).

        ``now`` (the caller's clock, the one ``Engine.mark_sent`` stamps with) is required by the
        real-time policy, and times the waits for persona slots (rule P4; None: they are not timed).
        """
        released, moves = tuple(self._released), tuple(self._moves)
        self._released.clear()
        self._moves.clear()
        if now is not None:
            for record in self.waiting:
                if record.queued_since is None:
                    record.queued_since = now
        admissible = self._admissible(now)
        admitted, decode = self._decide(now, admissible)
        for record in admissible[:admitted]:
            self.waiting.remove(record)  # the head, unless rule P3 (or B1) passed over requests before it
        prefills = tuple(self._admit(record) for record in admissible[:admitted])
        # Admitted rows take the slots after the running ones, so the slots stay ascending.
        slots = decode + tuple(item.slot for item in prefills)
        owners = self.slots.owners
        request_ids = tuple(owners[slot] for slot in slots)
        records = [self.records[rid] for rid in request_ids]
        if now is not None:
            for record in records:
                record.decoded_at = now
        step_indices = tuple(record.step_index for record in records)
        return StepPlan(released, moves, prefills, request_ids, step_indices, slots)

    def _decide(self, now: float | None, admissible: list[RequestRecord]) -> tuple[int, tuple[int, ...]]:
        """How many of the ``admissible`` requests to admit (a prefix), and which used slots decode (ascending)."""
        free = len(admissible)
        tokens = [record.prepared.prompt_positions for record in admissible]
        if self.realtime is None:
            return admit_count(tokens, free, self.config.max_prefill_tokens_per_step), tuple(range(self.slots.num_used))
        if now is None:
            raise ValueError("the real-time policy schedules by the clock: pass schedule(now)")
        policy = self.realtime
        running = sorted((self.records[rid] for rid in self.slots.owners), key=lambda s: s.serial)
        rows = RunningRows(
            deadlines=[self._deadline(record, policy, now) for record in running],
            weights=policy.weights(record.request.params.inference_timesteps for record in running),
            lead_bounds=[record.request.max_ahead_s for record in running],
            batch=frozenset(index for index, record in enumerate(running) if record.is_batch),
            timesteps=[record.request.params.inference_timesteps for record in running],
        )
        waiting = WaitingRequests(
            tokens,
            policy.weights(record.request.params.inference_timesteps for record in admissible),
            realtime=sum(not self._queues_as_batch(record, now) for record in admissible),
            timesteps=[record.request.params.inference_timesteps for record in admissible],
        )
        decision = policy.decide(now, rows, waiting, free)
        return decision.admit, tuple(sorted(self.slots.slot_of(running[i].request_id) for i in decision.decode))

    def next_step_at(self, now: float) -> float:
        """When a step would next do any work: ``now`` if it would now, ``inf`` if only new requests can
        make it. Under the real-time policy a step whose running sessions are all far enough ahead
        decodes nothing; the caller should wait until this time instead."""
        if self._released or self._moves or self._aborted:
            return now
        admissible = self._admissible(now)  # stamps the requests waiting for a persona slot (rule P4)
        policy = self.realtime
        if self.slots.num_used and policy is None:
            return now
        running = [self.records[rid] for rid in self.slots.owners]
        live = any(not record.is_batch for record in running)
        # A waiting request the next step admits: a real-time one always (rule 4), a batch one when it fits (B1, B3).
        starts = [self._admitted_from(record, policy, now, live) for record in admissible[:1]]
        # A request waiting for a persona slot ends busy once its wait is over (rule P4): a step is due then.
        bound = self.config.max_persona_wait_s
        starts += [since + bound for since in (s.persona_wait_since for s in self.waiting) if since is not None]
        if policy is not None:
            starts += [
                policy.runs_from(self._deadline(record, policy, now), record.request.max_ahead_s, record.is_batch, live)
                for record in running
            ]
        return max(now, min(starts, default=math.inf))

    def _admitted_from(self, record: RequestRecord, policy: RealtimePolicy | None, now: float, live: bool) -> float:
        """When the next step would admit ``record``, the head of the admissible requests (rules 4, B1 and B3;
        ``live``: whether real-time streams run)."""
        if policy is None or not self._queues_as_batch(record, now):
            return now
        if not live or policy.fits(record.row_weight, record.prepared.prompt_positions, policy.step_budget_s):
            return now
        since = now if record.queued_since is None else record.queued_since
        return since + self.config.max_batch_gap_s

    def _queues_as_batch(self, record: RequestRecord, now: float | None) -> bool:
        """Rule B1: a batch request queues behind the real-time ones until it has waited ``max_batch_gap_s``."""
        if not record.is_batch:
            return False
        since = record.queued_since
        return now is None or since is None or now - since < self.config.max_batch_gap_s

    def _deadline(self, record: RequestRecord, policy: RealtimePolicy, now: float) -> float:
        """Rule 1's playback deadline of a real-time row; rule B2's of a batch row."""
        if record.is_batch:
            return (now if record.decoded_at is None else record.decoded_at) + self.config.max_batch_gap_s
        start = record.playback_start(self.config.playback_lead_s)
        return playback_deadline(start, record.step_index, policy.chunk_s / record.request.playback_speed)

    def finish(self, results: Iterable[tuple[RequestRecord, RequestStatus]]) -> None:
        """Record the final status of running sessions and free their slots."""
        # Highest slot first, so no session that is leaving gets moved (see SlotTable.release).
        for record, status in sorted(results, key=lambda r: self.slots.slot_of(r[0].request_id), reverse=True):
            self._release(record)
            record.status = status
            del self.records[record.request_id]

    def has_unfinished(self) -> bool:
        """Whether some request still owes its final output."""
        return bool(self.records)

    def has_housekeeping(self) -> bool:
        """Whether released ids or slot moves are waiting to be delivered to the runner."""
        return bool(self._released or self._moves)

    def _admit(self, record: RequestRecord) -> PrefillItem:
        record.status = RequestStatus.RUNNING
        slot = self.slots.allocate(record.request_id)
        record.blocks = self.blocks.allocate(self.blocks.blocks_for(record.prepared.kv_positions))
        return PrefillItem(record.request_id, slot, record.request, record.prepared, record.blocks)

    # ---- the admission gate: slots, persona slots and KV blocks (see blocks.py) ----
    def _admissible(self, now: float | None) -> list[RequestRecord]:
        """The waiting requests that have a free slot, their persona and their KV blocks, in FIFO order: the
        policy admits a prefix of them, so the gate never undoes a decision it budgeted a step on."""
        candidates = self._with_personas(now)
        return candidates[: self._fit_blocks(candidates)]

    def _queue_order(self, now: float | None) -> list[RequestRecord]:
        """The waiting requests in admission order (rule B1): the real-time ones (and batch ones that have waited
        ``max_batch_gap_s``) by arrival, then the other batch ones by arrival; batch ones only as many as the batch
        cap (``max_batch_running``) has slots left for, the earliest first."""
        waiting = self.waiting
        if not any(record.is_batch for record in waiting):
            return list(waiting)
        cap = self.config.max_batch_running
        room = math.inf if cap is None else cap - sum(self.records[rid].is_batch for rid in self.slots.owners)
        first: list[RequestRecord] = []
        later: list[RequestRecord] = []
        for record in waiting:
            if record.is_batch:
                if room <= 0:
                    continue  # it waits for a batch slot
                room -= 1
                if self._queues_as_batch(record, now):
                    later.append(record)
                    continue
            first.append(record)
        return first + later

    def _with_personas(self, now: float | None) -> list[RequestRecord]:
        """The first waiting requests, one per free slot, in admission order, passing over those whose persona
        cannot have a device slot now (rules P1-P3); those are stamped with why, and since when (rule P4's clock)."""
        free = self.slots.num_free
        slots = self.persona_slots()
        if slots is None or not free:
            return self._queue_order(now)[:free]
        gate: _PersonaGate | None = None
        candidates: list[RequestRecord] = []
        for record in self._queue_order(now):
            request = record.request
            if request.persona is not None:
                if gate is None:
                    running = (self.records[rid].request for rid in self.slots.owners)
                    gate = _PersonaGate(running, slots, self.config.persona_slots_per_owner)
                wait = gate.wait(request)
                if wait is not None:
                    record.persona_wait = wait
                    if record.persona_wait_since is None:
                        record.persona_wait_since = now
                    continue
                gate.take(request)
            record.persona_wait_since = None  # it can have its persona: it waits for nothing of P1-P2 now
            candidates.append(record)
            if len(candidates) == free:
                break
        return candidates

    def _fit_blocks(self, candidates: list[RequestRecord]) -> int:
        """How many of ``candidates``, in order, the free KV blocks hold."""
        free = self.blocks.num_free
        for fitted, record in enumerate(candidates):
            need = self.blocks.blocks_for(record.prepared.kv_positions)
            if need > free:
                return fitted
            free -= need
        return len(candidates)

    def _release(self, record: RequestRecord) -> None:
        self.blocks.free(record.blocks)
        record.blocks = ()
        move = self.slots.release(record.request_id)
        self._released.append(record.request_id)
        if move is not None:
            self._moves.append(move)


class _PersonaGate:
    """Rules P1 and P2 over one admission walk: the personas the running requests hold (one device slot each,
    shared by all their requests), the distinct personas each owner's running requests use, and the requests the
    walk lets through so far (``take``)."""

    def __init__(self, running: Iterable[Request], slots: int, per_owner: int | None) -> None:
        self.slots = slots
        self.per_owner = per_owner
        self.held: set[str] = set()
        self.owned: dict[str, set[str]] = {}
        for request in running:
            self.take(request)

    def wait(self, request: Request) -> PersonaWait | None:
        """Why ``request`` (with a persona) cannot have its persona now; None: it can."""
        persona = request.persona
        owned = self.owned.get(request.owner, set()) if request.owner is not None else set()
        if self.per_owner is not None and persona not in owned and len(owned) >= self.per_owner:
            return PersonaWait.OWNER_CAP
        if persona not in self.held and len(self.held) >= self.slots:
            return PersonaWait.SLOTS_HELD
        return None

    def take(self, request: Request) -> None:
        """``request`` runs (or will): its persona is held, and counts for its owner."""
        persona = request.persona
        if persona is None:
            return
        self.held.add(persona)
        if request.owner is not None:
            self.owned.setdefault(request.owner, set()).add(persona)
