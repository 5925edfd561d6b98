"""Graph buckets: every batch size has one, padding stays small, and a step's timesteps round up to its timestep
bucket."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from voxwire.engine.cuda_graphs import StepGraphs, bucket_sizes
from voxwire.engine.timestep_buckets import bucket_of, timestep_buckets


@pytest.mark.parametrize("max_rows", [1, 5, 32, 33, 100, 768, 1000])
def test_every_batch_size_has_a_bucket_with_little_padding(max_rows: int) -> None:
    sizes = bucket_sizes(max_rows)
    assert sizes[-1] == max_rows and list(sizes) == sorted(set(sizes))
    graphs = StepGraphs(lambda bucket, timesteps: None, sizes, (10, 50))  # type: ignore[arg-type,return-value]
    for rows in range(1, max_rows + 1):
        bucket = graphs.bucket(rows)
        assert bucket >= rows
        if rows > 32:
            assert bucket <= rows * 1.125, (rows, bucket)


def test_768_rows_need_few_buckets_in_steps_of_16_or_32_at_the_top() -> None:
    sizes = bucket_sizes(768)
    assert sizes[:6] == (1, 2, 4, 8, 16, 32)
    assert len(sizes) <= 48
    assert {b - a for a, b in itertools.pairwise(sizes) if a >= 256} == {32}


def test_a_step_runs_the_smallest_captured_timestep_count_that_covers_it() -> None:
    graphs = StepGraphs(lambda bucket, timesteps: None, (1, 2), (10, 4, 50))  # type: ignore[arg-type,return-value]
    assert [int(bucket_of(graphs.timestep_counts, t)) for t in (1, 4, 5, 10, 11, 50)] == [4, 4, 10, 10, 50, 50]


def test_each_row_runs_in_the_smallest_timestep_bucket_that_covers_it() -> None:
    buckets = timestep_buckets(50, (10, 4, 50))
    assert buckets == (4, 10, 50)
    rows = np.array([1, 4, 5, 10, 11, 50])
    assert bucket_of(buckets, rows).tolist() == [4, 4, 10, 10, 50, 50]
