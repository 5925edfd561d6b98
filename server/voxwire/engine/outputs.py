"""The values that cross the engine's boundaries, and the runner contract.

``StepPlan`` is the only thing the engine hands the runner and ``RunnerOutput`` the only thing it
gets back (vLLM's SchedulerOutput / ModelRunnerOutput split); callers of ``Engine.step`` receive one
``voxwire.chunk.Chunk`` per session. This module holds no logic beyond trivial views of these values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from voxwire.chunk import Audio, Patch
from voxwire.engine.cost_model import StepCost
from voxwire.engine.request import Prepared, Request
from voxwire.engine.slots import SlotMove


@dataclass(frozen=True, slots=True)
class PrefillItem:
    """A request admitted this step: reset row ``slot`` and prefill it with ``request``, as ``prepared``.

    ``blocks`` are the KV blocks the request owns from now until it is released, in position order
    (position p lives in ``blocks[p // block_size]``): every position it can reach, prompt included."""

    request_id: str
    slot: int
    request: Request
    prepared: Prepared
    blocks: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class StepPlan:
    """One step's work for the runner, to be applied in field order.

    1. ``released``: forget any per-request state kept for these ids (their rows are free, their
       KV blocks back in the pool; the ids may include requests whose prefill never completed).
    2. ``moves``: copy each row ``src`` to ``dst``, in order (slot compaction after releases). A row's
       KV blocks stay where they are: only its small per-row state and block table move.
    3. ``prefills``: reset each row and prefill it into its blocks.
    4. Decode one patch for each slot of ``decode_slots`` (running and just-prefilled alike).

    ``decode_slots`` may be any subset of the occupied slots, in any order: a scheduler may leave out
    rows that are far enough ahead of their listener. The runner gathers those rows into a batch and
    scatters their state back, so it never assumes ``0..n-1``. A prefilled request is always decoded
    in the step that prefills it.
    """

    released: tuple[str, ...] = ()
    moves: tuple[SlotMove, ...] = ()
    prefills: tuple[PrefillItem, ...] = ()
    request_ids: tuple[str, ...] = ()
    """Owner of each decode row."""
    step_indices: tuple[int, ...] = ()
    """Per decode row, the index of the patch to generate (0 for a row prefilled this step)."""
    decode_slots: tuple[int, ...] = ()
    """Per decode row, the slot that holds its state (aligned with ``request_ids``)."""

    @property
    def is_empty(self) -> bool:
        return not (self.released or self.moves or self.prefills or self.request_ids)


# eq=False: the fields hold arrays, which have no single truth value to compare by.
@dataclass(frozen=True, slots=True, eq=False)
class RunnerOutput:
    """What the runner produced for one ``StepPlan``.

    ``audio`` and ``stop_flags`` are aligned with ``plan.decode_slots`` (and ``plan.request_ids``).
    Every request prefilled this step has a length cap unless it is in ``errors``. A request in
    ``errors`` (a failed prefill, e.g. a text that tokenizes to nothing, or a failure of that row
    alone) finishes with ``FinishReason.ERROR`` and its slot is freed; its audio and stop flag are
    ignored (empty audio is customary). A failed prefill still has a decode row in the plan,
    because the plan is made before the runner finds the failure; the runner may skip computing it.
    """

    audio: tuple[Audio, ...] = ()
    """Per decode row, the step's audio (one patch of samples)."""
    stop_flags: tuple[bool, ...] = ()
    length_caps: dict[str, int] = field(default_factory=dict)
    """Per request prefilled this step: min(int(text tokens * 6 + 10), max_len)."""
    errors: dict[str, str] = field(default_factory=dict)
    """Per failed request, a message for the client."""
    patches: tuple[Patch, ...] = ()
    """Aligned with ``audio`` when the runner reports them: each row's latent patch, which a caller
    keeps to continue the voice in a later utterance (a continuation prompt). Empty if not reported."""


class Runner(Protocol):
    """Owns the model, the state pool of ``num_slots`` rows and the KV block pool; the only part that
    touches tensors.

    ``execute`` may raise: the engine then fails every session of that plan with
    ``FinishReason.ERROR`` and releases them. So apply ``released`` and ``moves`` before anything
    that can fail, so that the pool matches the engine's slot table whatever happens later.
    An empty plan is never passed; a plan without decode rows only carries housekeeping.
    """

    @property
    def num_slots(self) -> int: ...

    @property
    def num_kv_blocks(self) -> int:
        """Blocks in the KV pool, the null block 0 included (the engine hands out ``1..n-1``)."""
        ...

    @property
    def block_size(self) -> int:
        """Positions per KV block."""
        ...

    @property
    def graph_captures(self) -> int:
        """CUDA graphs captured so far (0 where none are used)."""
        ...

    @property
    def graph_capture_seconds(self) -> float:
        """Wall time those captures took (0 where none are used)."""
        ...

    def prepare(self, request: Request) -> Prepared:
        """Lay ``request`` out for its prefill, once, when the engine takes it (between steps, on the engine's
        thread). Never raises for a request it cannot serve: it returns ``Prepared.refused`` (its prefill then
        fails with the reason)."""
        ...

    def execute(self, plan: StepPlan) -> RunnerOutput: ...


@runtime_checkable
class TimestepWeightedRunner(Protocol):
    """A runner whose rows cost by their CFM timestep count (``ModelRunner``: one sub-step per timestep
    bucket); the real-time policy then counts each row as ``row_weight`` rows of ``step_cost``."""

    def row_weight(self, timesteps: int) -> float:
        """What a row asking for ``timesteps`` costs, in rows at the default timestep count."""
        ...


@runtime_checkable
class PersonaRunner(Protocol):
    """A runner with a bounded number of LoRA persona slots (``ModelRunner`` over a model with a ``PersonaBank``):
    the scheduler admits a request with a persona only when its persona can have one (``engine.scheduler``)."""

    @property
    def persona_slots(self) -> int | None:
        """Personas its device holds at once, for running requests (None: no personas, no bound: a persona
        request then fails at prefill as unknown)."""
        ...


@runtime_checkable
class RealtimeRunner(Runner, Protocol):
    """A runner the real-time policy (``EngineConfig.realtime``) may schedule: one that states what a
    step costs, which the policy budgets steps with. ``ModelRunner`` measures its ``step_cost`` at
    start-up (``measure_cost=True``, ``engine.calibration``); a simulated one is given it.
    """

    @property
    def step_cost(self) -> StepCost: ...

    @property
    def chunk_seconds(self) -> float:
        """Seconds of audio in one chunk: the real-time budget of a step."""
        ...
