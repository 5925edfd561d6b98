"""Decode steps replayed as CUDA graphs: one graph per (batch bucket, CFM timestep count), all captured
before serving starts.

A batch of n rows runs as the smallest bucket b >= n (``bucket_sizes``: powers of two up to 32, then
steps of at most 1/8 of the size, so padding stays <= 12.5% above 32). A graph holds the whole step:
gathering the rows' state, every CFM timestep, LocEnc, both LM steps with paged attention, the
streaming VAE decode, and scattering the state back. Its inputs are device buffers the runner fills
before a replay (the batch's slot indices) and per-slot tables written at prefill, so shapes and
addresses are fixed per key: what capture needs.

The timestep counts are the runner's timestep buckets: a row runs in the smallest one that covers it
(``engine.timestep_buckets``), and rows with fewer are masked (``CfmSchedule.ragged``). ``capture_all``
warms up and captures every key once; a key missing at run time (never, when ``capture_all`` ran) is
captured then and counted in ``captures``, which the server exports so a capture while serving is
visible, with the time all captures took (``capture_seconds``, warm-up runs included: what delays
``/ready``). On CPU none of this is used.
"""

from __future__ import annotations

import bisect
import inspect
import time
import weakref
from collections.abc import Callable, Sequence

import torch

from voxwire import devices
from voxwire.startup import Progress

StepFunction = Callable[[int, int], torch.Tensor]
"""step(bucket, timesteps) -> the step's packed output (bucket, F)."""


def bucket_sizes(max_rows: int) -> tuple[int, ...]:
    """Batch sizes graphs are captured for: 1, 2, 4, ..., 32, then steps of 4 to 64, 8 to 128, 16 to
    256 and 32 beyond (each step at most 1/8 of the bucket), ending at ``max_rows``."""
    sizes: list[int] = []
    size = 1
    while size < max_rows:
        sizes.append(size)
        size = size * 2 if size < 32 else size + min(32, 1 << (size.bit_length() - 4))
    return (*sizes, max_rows)


class StepGraphs:
    """Captures ``step(bucket, timesteps)`` per key and replays it."""

    def __init__(
        self, step: StepFunction, buckets: Sequence[int], timesteps: Sequence[int], device: torch.device | None = None
    ) -> None:
        """``device``: the CUDA device the step runs on (None: the current one); captures happen there."""
        # A bound method (the runner's ``_graph_step``) is held weakly: its runner owns these graphs, and a
        # strong reference back would be a cycle keeping a discarded runner's graphs, graph pool and KV cache
        # alive until the cycle collector ran; the next runner would size its KV pool around them.
        self._step: Callable[[], StepFunction | None] = (
            weakref.WeakMethod(step) if inspect.ismethod(step) else lambda: step
        )
        self.device = device
        self.buckets = tuple(buckets)
        self.timestep_counts = tuple(sorted(timesteps))
        # One memory pool shared by every graph, made at the first capture (torch names its type privately).
        self.pool: torch.cuda._POOL_HANDLE | None = None
        self.graphs: dict[tuple[int, int], tuple[Callable[[], object], torch.Tensor]] = {}
        self.captures = 0
        self.capture_seconds = 0.0

    @property
    def step(self) -> StepFunction:
        step = self._step()
        assert step is not None, "the runner of these graphs is gone"
        return step

    def bucket(self, count: int) -> int:
        return self.buckets[bisect.bisect_left(self.buckets, count)]

    @property
    def count(self) -> int:
        """Graphs ``capture_all`` makes: one per (bucket, timesteps) key."""
        return len(self.buckets) * len(self.timestep_counts)

    def capture_all(self) -> None:
        """Capture every (bucket, timesteps) key, largest first (the shared pool is sized by the first), logging
        how far it is every few seconds (a few hundred keys on a large GPU take a minute).

        Each key runs once eagerly first (initialising lazily created kernels and workspaces outside the
        capture), on whatever the input buffers hold: the caller points them at padding rows."""
        started = time.perf_counter()
        progress = Progress("captured CUDA graphs", self.count)
        for bucket in reversed(self.buckets):
            for timesteps in reversed(self.timestep_counts):
                if (bucket, timesteps) not in self.graphs:
                    self.step(bucket, timesteps)
                    self._add(bucket, timesteps)
                progress.advance()
        self.capture_seconds += time.perf_counter() - started

    def run(self, bucket: int, timesteps: int) -> torch.Tensor:
        """Run the key's step; returns its output (a graph's static output is overwritten by its next replay).

        A key never captured runs eagerly (this step's work) and is captured for next time."""
        graph = self.graphs.get((bucket, timesteps))
        if graph is None:
            started = time.perf_counter()
            output = self.step(bucket, timesteps)
            self._add(bucket, timesteps)
            self.capture_seconds += time.perf_counter() - started
            return output
        replay, output = graph
        replay()
        return output

    def _add(self, bucket: int, timesteps: int) -> None:
        self.graphs[(bucket, timesteps)] = self._capture(bucket, timesteps)
        self.captures += 1

    def _capture(self, bucket: int, timesteps: int) -> tuple[Callable[[], object], torch.Tensor]:
        """Record the step without running it; returns the replay function and the static output."""
        with devices.scope(self.device):  # the pool, the graph and its capture stream on the step's device
            if self.pool is None:
                self.pool = torch.cuda.graph_pool_handle()
            graph = torch.cuda.CUDAGraph()
            # thread_local: other threads (voice encoding) may use the GPU while this thread captures.
            with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
                output = self.step(bucket, timesteps)
        return graph.replay, output
