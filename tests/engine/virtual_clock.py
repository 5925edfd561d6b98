"""An engine driven in virtual time, as a server would drive it: nothing sleeps."""

from __future__ import annotations

from voxwire.chunk import Chunk
from voxwire.engine import Engine


class Clock:
    """Virtual time: a step lasts what the runner's cost model says, and its chunks leave at its end."""

    def __init__(self, engine: Engine) -> None:
        self.engine, self.now = engine, 0.0

    def step(self) -> list[Chunk]:
        """Wait until the engine has work (as a server would), then run one step."""
        self.now = max(self.now, self.engine.next_step_at(self.now))
        runner = self.engine.runner
        before = len(runner.plans)
        outputs = self.engine.step(self.now)
        if len(runner.plans) > before:
            plan = runner.plans[-1]
            tokens = sum(item.prepared.prompt_positions for item in plan.prefills)
            self.now += runner.step_cost.seconds(len(plan.decode_slots), tokens)
        self.engine.mark_sent(self.now)
        return outputs
