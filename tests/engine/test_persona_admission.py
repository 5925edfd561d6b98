"""Issue 20, item 6: requests wait in the engine's queue for a LoRA persona slot (scheduler rules P1-P4).

Before, the scheduler admitted a persona request whenever an engine slot was free; with every persona slot held by
running requests the runner's bank refused it and the request failed at once (``synthesis_failed``, 422). Now the
scheduler admits it only when its persona can have a slot, passes over it meanwhile (no one behind it waits for it),
caps the persona slots one owner holds, and ends a request that waited too long ``busy``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from voxwire.chunk import Chunk
from voxwire.engine import Engine, EngineConfig, FinishReason, QueueFullError, Request, StepPlan, SynthesisParams
from voxwire.engine.cost_model import StepCost
from voxwire.engine.outputs import RunnerOutput

from .conftest import FakeRunner


@dataclass
class PersonaFakeRunner(FakeRunner):
    """A ``FakeRunner`` with ``persona_slots`` device slots for personas, checked as the bank would: the personas
    of the running rows never need more slots than there are (the bank would refuse the prefill)."""

    persona_slots: int | None = 4
    personas: dict[str, str | None] = field(default_factory=dict)
    held_most: int = 0
    """The most distinct personas the running rows held at once."""

    def execute(self, plan: StepPlan) -> RunnerOutput:
        for item in plan.prefills:
            self.personas[item.request_id] = item.request.persona
        output = super().execute(plan)  # housekeeping applied: the rows are the running requests now
        held = {self.personas[rid] for rid in self.rows if rid is not None} - {None}
        assert self.persona_slots is None or len(held) <= self.persona_slots, f"{held} in {self.persona_slots} slots"
        self.held_most = max(self.held_most, len(held))
        return output


@dataclass
class PersonaRealtimeRunner(PersonaFakeRunner):
    """The same, as a ``RealtimeRunner``."""

    subsets: bool = True
    step_cost: StepCost = field(default_factory=lambda: StepCost.parse("4ms+1ms/row+0.1ms/token"))
    chunk_seconds: float = 0.16


def persona_engine(slots: int = 4, rows: int = 8, **config: object) -> tuple[Engine, PersonaFakeRunner]:
    runner = PersonaFakeRunner(num_slots=rows, persona_slots=slots)
    return Engine(runner, EngineConfig(max_running=rows, **config)), runner  # type: ignore[arg-type]


def persona_request(rid: str, persona: str | None, owner: str | None = None, patches: int = 5) -> Request:
    """A request of exactly ``patches`` steps (``min_len`` keeps the stop flag out of it)."""
    return Request(rid, "hello world", SynthesisParams(max_len=patches), persona=persona, owner=owner)


def admitted_at(runner: PersonaFakeRunner) -> dict[str, int]:
    """The plan index in which each request was prefilled."""
    return {item.request_id: step for step, plan in enumerate(runner.plans) for item in plan.prefills}


def run(engine: Engine, arrivals: dict[int, list[Request]], dt: float = 0.01) -> dict[str, list[Chunk]]:
    """Step ``engine`` on a virtual clock (``dt`` a step) until done, adding ``arrivals[i]`` before step ``i``."""
    outputs: dict[str, list[Chunk]] = {}
    step = 0
    while step <= max(arrivals) or engine.has_work():
        for request in arrivals.get(step, []):
            engine.add(request)
        for chunk in engine.step(step * dt):
            outputs.setdefault(chunk.request_id, []).append(chunk)
        step += 1
        assert step < 10_000, "the engine never finished"
    return outputs


def test_six_personas_on_four_slots_all_run_the_last_two_once_slots_free() -> None:
    """Probe N6: 6 requests, each a different persona, 4 persona slots and 8 engine slots. Before, 4 ran and 2
    failed at once (the bank had no slot). Now the 2 wait for slots and every request speaks to its end."""
    engine, runner = persona_engine(slots=4)
    requests = [persona_request(f"r{i}", f"P{i}", owner=f"client-{i}", patches=5 + i) for i in range(6)]
    outputs = run(engine, {0: requests})
    for request in requests:
        chunks = outputs[request.request_id]
        assert chunks[-1].finish_reason is FinishReason.LENGTH, chunks[-1].error
        assert sum(chunk.audio.size > 0 for chunk in chunks) == request.params.max_len
    steps = admitted_at(runner)
    assert [steps[f"r{i}"] for i in range(4)] == [0] * 4
    # r0 (5 patches) leaves after step 4, r1 after step 5: r4 and r5 take their slots in the next steps.
    assert (steps["r4"], steps["r5"]) == (5, 6)
    assert runner.held_most == 4


def test_a_request_waiting_for_a_persona_slot_delays_no_one_behind_it() -> None:
    """Rule P3: with the one persona slot held by A, a request for B waits; a request without persona and one for
    A (held already: no new slot) that come after it start in the very step they arrive; B's later request keeps
    FIFO order behind the first."""
    engine, runner = persona_engine(slots=1)
    holder = persona_request("holder", "A", patches=6)
    waiting = persona_request("b1", "B")
    plain, same = persona_request("plain", None), persona_request("a2", "A")
    later = persona_request("b2", "B", patches=2)
    outputs = run(engine, {0: [holder], 1: [waiting, plain, same], 2: [later]})
    steps = admitted_at(runner)
    assert steps["plain"] == steps["a2"] == 1
    assert steps["b1"] == 6 and steps["b2"] >= steps["b1"]  # after A's last holder ("a2": steps 1-5) left
    assert all(outputs[rid][-1].finish_reason is FinishReason.LENGTH for rid in outputs)


def test_one_owner_holds_at_most_its_cap_of_persona_slots() -> None:
    """Rule P2: owner x asks for 4 personas at once with a cap of 2: two run, two wait; owner y's persona request,
    after all of x's, starts at once; x's further request for a persona it holds takes no new slot, starts too."""
    engine, runner = persona_engine(slots=4, persona_slots_per_owner=2)
    mine = [persona_request(f"x{i}", f"P{i}", owner="x", patches=4) for i in range(4)]
    theirs = persona_request("y", "Q", owner="y")
    again = persona_request("x-again", "P0", owner="x")
    outputs = run(engine, {0: [*mine, theirs], 1: [again]})
    steps = admitted_at(runner)
    assert (steps["x0"], steps["x1"], steps["y"], steps["x-again"]) == (0, 0, 0, 1)
    # x0 and x1 (steps 0-3) leave, x-again (steps 1-5) keeps P0: x holds one persona, so one more may run.
    assert (steps["x2"], steps["x3"]) == (4, 6)
    assert all(outputs[rid][-1].finish_reason is FinishReason.LENGTH for rid in outputs)


def test_a_request_that_waits_too_long_ends_busy_without_running() -> None:
    """Rule P4: the one slot held by a long request, a request for another persona ends ``busy`` (a retryable
    refusal, never an error) once it has waited ``max_persona_wait_s``; it was never prefilled."""
    engine, runner = persona_engine(slots=1, max_persona_wait_s=0.05)
    holder = persona_request("holder", "A", patches=40)
    outputs = run(engine, {0: [holder], 1: [persona_request("b", "B")]}, dt=0.01)
    last = outputs["b"][-1]
    assert len(outputs["b"]) == 1 and last.finish_reason is FinishReason.BUSY
    assert "persona 'B'" in (last.error or "") and "every persona slot is held" in (last.error or "")
    assert "b" not in admitted_at(runner)
    assert outputs["holder"][-1].finish_reason is FinishReason.LENGTH


def test_the_wait_ends_on_time_when_nothing_else_is_due() -> None:
    """A step is due when a wait ends, even under the real-time policy with every stream far ahead of its listener
    (else the engine would sleep past it): ``next_step_at`` names it, and that step ends the request ``busy``."""
    runner = PersonaRealtimeRunner(num_slots=2, persona_slots=1)
    config = EngineConfig(max_running=2, realtime=True, max_persona_wait_s=0.5, max_ahead_s=5.0, playback_lead_s=10.0)
    engine = Engine(runner, config)
    engine.add(persona_request("holder", "A", patches=400))
    engine.step(0.0)
    engine.mark_sent(0.0)  # its listener starts at 10 s: far ahead, it skips steps for a while
    engine.add(persona_request("b", "B"))
    engine.step(0.1)  # b is found waiting at 0.1
    assert engine.next_step_at(0.2) == pytest.approx(0.6)
    assert engine.step(0.55) == []
    assert [(c.request_id, c.finish_reason) for c in engine.step(0.6)] == [("b", FinishReason.BUSY)]


def test_the_queue_bound_still_holds_for_requests_waiting_for_personas() -> None:
    engine, _ = persona_engine(slots=1, rows=1, max_waiting=1)
    engine.add(persona_request("holder", "A", patches=40))
    engine.step(0.0)
    engine.add(persona_request("b", "B"))
    with pytest.raises(QueueFullError):
        engine.add(persona_request("c", "C"))
