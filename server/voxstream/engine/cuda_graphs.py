"""Decode steps replayed as CUDA graphs: one graph per (batch bucket, CFM timestep count).

A batch of n live rows runs as the smallest bucket b >= n (powers of two up to the slot count), on
views ``[:b]`` of the runner's pool, so the shapes and the pool's addresses are fixed per bucket: what
graph capture needs. A graph holds the whole step, every CFM timestep, LocEnc, both LM steps and the
streaming VAE decode of the new patch, so a step costs one launch instead of thousands (nano-vLLM's
main speed-up, here extended to the diffusion loop and the VAE).

Inputs that change per step (noise, guidance strength, time grids) are copied into static buffers
before a replay. Rows ``n..b-1`` are padding: they compute on zero noise at position 0 of free slots
and their results are never read. Every row's time grid is padded to the graph's timestep count and
masked (``CfmSchedule.ragged``), so rows with fewer timesteps share the graph.

The first use of a graph key runs eagerly (warming up lazily created kernels and workspaces); the
second captures, then every use replays. On CPU none of this is used: the same step runs eagerly.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from voxstream.model.cfm import CfmSchedule

StepResult = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # patch (b, P, D), stop logits (b, 2), audio (b, S)
StepFunction = Callable[[int, torch.Tensor, torch.Tensor, CfmSchedule], StepResult]


def buckets_for(num_slots: int) -> tuple[int, ...]:
    """Powers of two below ``num_slots``, and ``num_slots`` itself."""
    sizes = [1 << k for k in range(num_slots.bit_length()) if (1 << k) < num_slots]
    return (*sizes, num_slots)


class StepGraphs:
    """Captures and replays ``step(bucket, noise, cfg, schedule)`` per (bucket, timesteps)."""

    def __init__(
        self,
        step: StepFunction,
        positions: torch.Tensor,
        noise_shape: tuple[int, int],
        dtype: torch.dtype,
        max_timesteps: int,
    ) -> None:
        """``positions`` is the pool's (slots,) position buffer (padding rows are parked at 0)."""
        self.step = step
        self.positions = positions
        slots, device = positions.size(0), positions.device
        self.buckets = buckets_for(slots)
        self.noise = torch.zeros((slots, *noise_shape), dtype=dtype, device=device)
        self.cfg = torch.zeros(slots, dtype=torch.float32, device=device)
        self.times = torch.zeros(slots, max_timesteps, dtype=dtype, device=device)
        self.deltas = torch.zeros(slots, max_timesteps, dtype=dtype, device=device)
        self.steps = torch.ones(slots, dtype=torch.long, device=device)
        self.zero_init = torch.ones(slots, dtype=torch.long, device=device)
        self.pool: object | None = None  # one memory pool shared by every graph, made at the first capture
        self.graphs: dict[tuple[int, int], tuple[Callable[[], object], StepResult]] = {}
        self.warmed_up: set[tuple[int, int]] = set()  # keys that already ran once eagerly

    def bucket(self, count: int) -> int:
        return next(size for size in self.buckets if size >= count)

    def run(self, count: int, noise: torch.Tensor, cfg: torch.Tensor, schedule: CfmSchedule) -> StepResult:
        """Run rows ``0..count-1``; returns their patch, stop logits and audio (views of static outputs)."""
        bucket, timesteps = self.bucket(count), schedule.max_steps
        key = (bucket, timesteps)
        static = self._load(count, bucket, noise, cfg, schedule)
        if key not in self.graphs and key not in self.warmed_up:
            self.warmed_up.add(key)
            outputs = self.step(bucket, self.noise[:bucket], self.cfg[:bucket], static)
        else:
            if key not in self.graphs:
                self.graphs[key] = self._capture(bucket, static)
            replay, outputs = self.graphs[key]
            replay()
        return tuple(t[:count] for t in outputs)  # type: ignore[return-value]

    def _capture(self, bucket: int, schedule: CfmSchedule) -> tuple[Callable[[], object], StepResult]:
        """Record the step without running it; returns the replay function and the static outputs."""
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        # thread_local: other threads (voice encoding) may use the GPU while this thread captures.
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
            outputs = self.step(bucket, self.noise[:bucket], self.cfg[:bucket], schedule)
        return graph.replay, outputs

    def _load(
        self, count: int, bucket: int, noise: torch.Tensor, cfg: torch.Tensor, schedule: CfmSchedule
    ) -> CfmSchedule:
        """Copy this step's inputs into the static buffers; park padding rows; return the static schedule."""
        timesteps = schedule.max_steps
        self.noise[:count].copy_(noise)
        self.noise[count:bucket].zero_()
        self.cfg[:count].copy_(cfg)
        self.positions[count:bucket].zero_()
        self.times[:count, :timesteps].copy_(schedule.times)
        self.deltas[:count, :timesteps].copy_(schedule.deltas)
        self.steps[:count].copy_(schedule.steps)
        self.zero_init[:count].copy_(schedule.zero_init)
        self.steps[count:bucket].fill_(1)
        self.zero_init[count:bucket].fill_(1)
        # Always masked and never skipping more than the first step (every row skips at least one), so
        # one graph serves any mix of rows with up to ``timesteps`` steps.
        return CfmSchedule(
            times=self.times[:bucket, :timesteps],
            deltas=self.deltas[:bucket, :timesteps],
            steps=self.steps[:bucket],
            zero_init=self.zero_init[:bucket],
            max_steps=timesteps,
            uniform_zero_init=1,
            ragged=True,
        )
