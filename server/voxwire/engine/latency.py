"""``LatencyHistogram``: durations counted in fixed buckets, a value the engine's thread replaces whole.

The engine's step times and queue waits are observed on the thread (or in the process) that owns the engine and
read at scrape time by the metrics, possibly in another process (the value travels with ``EngineStats``). An
immutable value, replaced at each observation, lets any reader see one consistent histogram without a lock and
keeps Prometheus off the engine's hot path. Histograms of several engines add up (``+``), which a summary's
quantiles cannot do. The bounds resolve 25-300 ms, where a step or a wait decides what a listener hears.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

LATENCY_BUCKETS_S: tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.125, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
"""Upper bounds (seconds, inclusive) of the buckets; one more bucket holds what exceeds the last."""

_EMPTY = (0,) * (len(LATENCY_BUCKETS_S) + 1)


@dataclass(frozen=True, slots=True)
class LatencyHistogram:
    """How many durations fell in each bucket, and their sum."""

    counts: tuple[int, ...] = _EMPTY
    """Per bucket, not cumulative: ``counts[i]`` holds the durations in (``LATENCY_BUCKETS_S[i-1]``,
    ``LATENCY_BUCKETS_S[i]``]; the last entry those above every bound."""
    total_s: float = 0.0

    def observe(self, seconds: float) -> LatencyHistogram:
        """This histogram with one more duration."""
        index = bisect_left(LATENCY_BUCKETS_S, seconds)
        counts = self.counts
        return LatencyHistogram((*counts[:index], counts[index] + 1, *counts[index + 1 :]), self.total_s + seconds)

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, durations at or below it) per bucket, the last bound ``inf``: Prometheus' ``le`` buckets."""
        bounds = (*LATENCY_BUCKETS_S, float("inf"))
        running, buckets = 0, []
        for bound, count in zip(bounds, self.counts, strict=True):
            running += count
            buckets.append((bound, running))
        return buckets

    def __add__(self, other: LatencyHistogram) -> LatencyHistogram:
        counts = tuple(a + b for a, b in zip(self.counts, other.counts, strict=True))
        return LatencyHistogram(counts, self.total_s + other.total_s)


NO_LATENCIES = LatencyHistogram()
"""The empty histogram (immutable, so one value serves every default)."""
