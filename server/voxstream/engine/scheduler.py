"""Which sessions the runner serves in each step, and in which rows.

The scheduler owns the bounded FIFO waiting queue, the running sessions and their slots, and the
housekeeping (released ids, slot moves) the runner must apply before the next step. It does not
run the model, build outputs, or decide when a stream ends: ``Engine`` does, and reports the
sessions that finished through ``Scheduler.finish``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from itertools import islice

from voxstream.engine.blocks import BlockAllocator
from voxstream.engine.config import EngineConfig
from voxstream.engine.errors import DuplicateRequestError, QueueFullError
from voxstream.engine.outputs import PrefillItem, StepPlan
from voxstream.engine.request import Request, RequestStatus, Session
from voxstream.engine.slots import SlotMove, SlotTable


def admit_count(prefill_tokens: Iterable[int], free_slots: int, token_budget: int) -> int:
    """The admission rule: how many requests at the head of the waiting queue join this step.

    Walk the waiting queue in FIFO order. Admit a request while a slot is free and the prefill
    tokens admitted so far plus its own stay within ``token_budget``. The first request is admitted
    whenever a slot is free, even if it alone exceeds the budget, so a long prompt cannot starve.
    Stop at the first request that does not fit: nothing overtakes it, so admission stays FIFO.

    Args:
        prefill_tokens: The ``prefill_tokens`` estimate of each waiting request, queue head first.
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


class Scheduler:
    """Builds one ``StepPlan`` per step and keeps the slot table compacted.

    Admission policy. Every step decodes *all* running sessions, one patch each. Requests from the
    waiting queue are admitted by ``admit_count`` into the same step: they are prefilled and then
    decoded with everyone else, so a new session gets its first chunk in the step that admits it.
    Arrivals therefore never take a step away from a running session; what they cost the running
    streams is bounded by ``max_prefill_tokens_per_step`` (plus at most one over-budget request).
    The batch never exceeds ``max_running`` rows, and the waiting queue never exceeds
    ``max_waiting`` requests.

    KV blocks: a request admitted gets every block it can reach (``blocks``), and admission stops at
    the first waiting request whose blocks are not free (it waits; nothing overtakes it).
    """

    def __init__(self, config: EngineConfig, blocks: BlockAllocator) -> None:
        self.config = config
        self.blocks = blocks
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
            QueueFullError: ``max_waiting`` requests are already waiting.
        """
        rid = request.request_id
        if rid in self.sessions:
            raise DuplicateRequestError(f"request id {rid!r} is already in use by an unfinished request")
        if len(self.waiting) >= self.config.max_waiting:
            raise QueueFullError(
                f"request {rid!r} rejected: the waiting queue is full "
                f"({self.config.max_waiting} requests waiting behind {self.slots.num_used} running)"
            )
        session = Session(request, kv_positions=kv_positions)
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

    def schedule(self) -> StepPlan:
        """Admit from the waiting queue and describe this step's work (see the class docstring)."""
        released, moves = tuple(self._released), tuple(self._moves)
        self._released.clear()
        self._moves.clear()
        tokens = (session.request.prefill_tokens for session in self.waiting)
        admitted = admit_count(tokens, self.slots.num_free, self.config.max_prefill_tokens_per_step)
        admitted = self._fit_blocks(admitted)
        prefills = tuple(self._admit(self.waiting.popleft()) for _ in range(admitted))
        request_ids = self.slots.owners
        step_indices = tuple(self.sessions[rid].step_index for rid in request_ids)
        return StepPlan(released, moves, prefills, request_ids, step_indices, tuple(range(len(request_ids))))

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

    # ---- KV blocks (the admission gate; see blocks.py) ----
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
