"""LatencyHistogram: the engine's step times and queue waits, kept as Prometheus buckets (upper bounds inclusive)
that resolve 25-300 ms, immutable, and summed over engines."""

from __future__ import annotations

from itertools import pairwise

import pytest

from voxwire.engine import LATENCY_BUCKETS_S, LatencyHistogram


def test_a_duration_counts_in_the_first_bucket_whose_bound_it_does_not_exceed() -> None:
    histogram = LatencyHistogram()
    for seconds in (0.025, 0.026, 0.3, 0.31, 42.0):
        histogram = histogram.observe(seconds)
    cumulative = dict(histogram.cumulative())
    assert cumulative[0.01] == 0
    assert cumulative[0.025] == 1  # exactly on a bound: in that bucket
    assert cumulative[0.05] == 2
    assert cumulative[0.3] == 3 and cumulative[0.4] == 4
    assert cumulative[10.0] == 4 and cumulative[float("inf")] == histogram.count == 5
    assert histogram.total_s == pytest.approx(0.025 + 0.026 + 0.3 + 0.31 + 42.0)


def test_the_bounds_resolve_25_to_300_ms() -> None:
    inside = [bound for bound in LATENCY_BUCKETS_S if 0.025 <= bound <= 0.3]
    assert len(inside) >= 8 and max(b - a for a, b in pairwise(inside)) <= 0.05 + 1e-9


def test_observing_leaves_the_histogram_it_started_from_unchanged_and_histograms_add() -> None:
    empty = LatencyHistogram()
    one = empty.observe(0.1)
    assert empty.count == 0 and one.count == 1
    both = one + LatencyHistogram().observe(2.0)
    assert both.count == 2 and both.total_s == pytest.approx(2.1)
    assert dict(both.cumulative())[0.1] == 1
