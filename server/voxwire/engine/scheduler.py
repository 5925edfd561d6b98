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
from collections.abc import Iterable
from itertools import islice

from voxwire.engine.blocks import BlockAllocator
from voxwire.engine.config import EngineConfig
from voxwire.engine.errors import DuplicateRequestError, QueueFullError
from voxwire.engine.outputs import PrefillItem, StepPlan
from voxwire.engine.policy import RealtimePolicy, admit_count, playback_deadline
from voxwire.engine.request import Request, RequestStatus, Session
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
    """

    def __init__(self, config: EngineConfig, blocks: BlockAllocator, realtime: RealtimePolicy | None = None) -> None:
        if config.realtime != (realtime is not None):
            raise ValueError("EngineConfig.realtime needs a RealtimePolicy, and only it takes one")
        self.config = config
        self.blocks = blocks
        self.realtime = realtime
        self._serial = 0
        self.slots = SlotTable(config.max_running)
        self.waiting: deque[Session] = deque()
        # Every request whose final output has not been emitted yet (waiting, running, aborted).
        self.sessions: dict[str, Session] = {}
        # Aborted since the last step; their final outputs are due at the next one.
        self._aborted: list[Session] = []
        # Housekeeping for the runner, delivered with the next plan.
        self._released: list[str] = []
        self._moves: list[SlotMove] = []

    def add(self, request: Request, kv_positions: int = 1) -> None:
        """Append ``request`` to the waiting queue; ``kv_positions``: the KV positions it can reach.

        Raises:
            DuplicateRequestError: a request with the same id has not finished yet.
            QueueFullError: ``max_waiting`` requests are already waiting beyond the free slots.
        """
        rid = request.request_id
        if rid in self.sessions:
            raise DuplicateRequestError(f"request id {rid!r} is already in use by an unfinished request")
        # Requests that the next step will hand a free slot are not waiting for one: only the rest count
        # against max_waiting, so a request is never refused while a slot is free.
        if len(self.waiting) >= self.config.max_waiting + self.slots.num_free:
            raise QueueFullError(
                f"request {rid!r} rejected: the waiting queue is full "
                f"({self.config.max_waiting} requests waiting behind {self.slots.num_used} running, no slot free)"
            )
        self._serial += 1
        session = Session(request, kv_positions=kv_positions, serial=self._serial)
        self.waiting.append(session)
        self.sessions[rid] = session

    def abort(self, request_id: str) -> bool:
        """Finish ``request_id`` as aborted, freeing its slot; False if it is unknown or finished."""
        session = self.sessions.get(request_id)
        if session is None or session.status.is_finished:
            return False
        if session.status is RequestStatus.WAITING:
            self.waiting.remove(session)
        else:
            self._release(session)
        session.status = RequestStatus.FINISHED_ABORTED
        self._aborted.append(session)
        return True

    def take_aborted(self) -> list[Session]:
        """The sessions aborted since the last call, whose final outputs the caller now emits."""
        aborted, self._aborted = self._aborted, []
        for session in aborted:
            del self.sessions[session.request_id]
        return aborted

    def schedule(self, now: float | None = None) -> StepPlan:
        """Admit from the waiting queue and describe this step's work (see the class docstring).

        ``now`` (the caller's clock, the one ``Engine.mark_sent`` stamps with) is required by the
        real-time policy and ignored otherwise.
        """
        released, moves = tuple(self._released), tuple(self._moves)
        self._released.clear()
        self._moves.clear()
        admitted, decode = self._decide(now)
        prefills = tuple(self._admit(self.waiting.popleft()) for _ in range(admitted))
        # Admitted rows take the slots after the running ones, so the slots stay ascending.
        slots = decode + tuple(item.slot for item in prefills)
        owners = self.slots.owners
        request_ids = tuple(owners[slot] for slot in slots)
        step_indices = tuple(self.sessions[rid].step_index for rid in request_ids)
        return StepPlan(released, moves, prefills, request_ids, step_indices, slots)

    def _decide(self, now: float | None) -> tuple[int, tuple[int, ...]]:
        """How many waiting requests to admit, and which used slots decode (ascending)."""
        free = self._admissible()
        tokens = (session.request.prefill_tokens for session in self.waiting)
        if self.realtime is None:
            return admit_count(tokens, free, self.config.max_prefill_tokens_per_step), tuple(range(self.slots.num_used))
        if now is None:
            raise ValueError("the real-time policy schedules by the clock: pass schedule(now)")
        running = sorted((self.sessions[rid] for rid in self.slots.owners), key=lambda s: s.serial)
        deadlines = [self._deadline(session, self.realtime) for session in running]
        policy = self.realtime
        weights = policy.weights(session.request.params.inference_timesteps for session in running)
        waiting = policy.weights(session.request.params.inference_timesteps for session in islice(self.waiting, free))
        decision = policy.decide(now, deadlines, tokens, free, weights, waiting)
        return decision.admit, tuple(sorted(self.slots.slot_of(running[i].request_id) for i in decision.decode))

    def next_step_at(self, now: float) -> float:
        """When a step would next do any work: ``now`` if it would now, ``inf`` if only new requests can
        make it. Under the real-time policy a step whose running sessions are all far enough ahead
        decodes nothing; the caller should wait until this time instead."""
        if self._released or self._moves or self._aborted or self._admissible():
            return now
        if not self.slots.num_used:
            return math.inf
        if self.realtime is None:
            return now
        policy = self.realtime
        earliest = min(self._deadline(self.sessions[rid], policy) for rid in self.slots.owners)
        return max(now, policy.runs_from(earliest))

    def _deadline(self, session: Session, policy: RealtimePolicy) -> float:
        start = session.playback_start(self.config.playback_lead_s)
        return playback_deadline(start, session.step_index, policy.chunk_s)

    def finish(self, results: Iterable[tuple[Session, RequestStatus]]) -> None:
        """Record the final status of running sessions and free their slots."""
        # Highest slot first, so no session that is leaving gets moved (see SlotTable.release).
        for session, status in sorted(results, key=lambda r: self.slots.slot_of(r[0].request_id), reverse=True):
            self._release(session)
            session.status = status
            del self.sessions[session.request_id]

    def has_unfinished(self) -> bool:
        """Whether some request still owes its final output."""
        return bool(self.sessions)

    def has_housekeeping(self) -> bool:
        """Whether released ids or slot moves are waiting to be delivered to the runner."""
        return bool(self._released or self._moves)

    def _admit(self, session: Session) -> PrefillItem:
        session.status = RequestStatus.RUNNING
        slot = self.slots.allocate(session.request_id)
        session.blocks = self.blocks.allocate(self.blocks.blocks_for(session.kv_positions))
        return PrefillItem(session.request_id, slot, session.request, session.blocks)

    # ---- the admission gate: slots and KV blocks (see blocks.py) ----
    def _admissible(self) -> int:
        """How many requests at the head of the queue have both a free slot and their KV blocks. The
        policy is given this bound, so the gate never undoes a decision it budgeted a step on."""
        return self._fit_blocks(min(self.slots.num_free, len(self.waiting)))

    def _fit_blocks(self, count: int) -> int:
        """How many of the first ``count`` waiting requests, in FIFO order, the free KV blocks hold."""
        free = self.blocks.num_free
        for fitted, session in enumerate(islice(self.waiting, count)):
            need = self.blocks.blocks_for(session.kv_positions)
            if need > free:
                return fitted
            free -= need
        return count

    def _release(self, session: Session) -> None:
        self.blocks.free(session.blocks)
        session.blocks = ()
        move = self.slots.release(session.request_id)
        self._released.append(session.request_id)
        if move is not None:
            self._moves.append(move)
