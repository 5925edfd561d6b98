"""Measuring a runner's ``StepCost``: time steps of a few shapes and fit the linear model to them.

The fit is non-negative least squares over ``fixed + per_row * rows + per_token * prefill_tokens``,
on the median of each shape's repeated timings: the median shrugs off a stray slow run (a page fault,
another process on the device), and a coefficient the data would make negative (noise on a term
that costs next to nothing) is pinned at zero and the others refitted, so the model never promises
a step cheaper than nothing. Pure functions of what they are given; the runner supplies the steps.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from voxwire.engine.cost_model import StepCost


@dataclass(frozen=True, slots=True)
class CostSample:
    """One timed step: it decoded ``rows`` rows and prefilled ``prefill_tokens`` positions."""

    rows: int
    prefill_tokens: int
    seconds: float


def fit_step_cost(samples: Iterable[CostSample]) -> StepCost:
    """The non-negative least-squares ``StepCost`` through the per-shape medians of ``samples``.

    Raises:
        ValueError: no samples, or a non-finite or negative time.
    """
    by_shape: dict[tuple[int, int], list[float]] = {}
    for sample in samples:
        if not (0 <= sample.seconds < float("inf")):
            raise ValueError(f"a step time of {sample.seconds!r} s is invalid: must be a finite number >= 0")
        by_shape.setdefault((sample.rows, sample.prefill_tokens), []).append(sample.seconds)
    if not by_shape:
        raise ValueError("no timed steps to fit a step cost to")
    design = np.array([(1.0, rows, tokens) for rows, tokens in by_shape], dtype=np.float64)
    times = np.array([statistics.median(values) for values in by_shape.values()], dtype=np.float64)
    # Three coefficients: trying every subset of them as the free ones (the rest pinned at zero) is an
    # exact non-negative least squares, and cheaper to read than an active-set loop.
    best: tuple[float, np.ndarray] | None = None
    for size in range(1, 4):
        for free in itertools.combinations(range(3), size):
            coef = np.zeros(3)
            coef[list(free)] = np.linalg.lstsq(design[:, free], times, rcond=None)[0]
            if (coef < 0).any():
                continue
            residual = float(np.sum((design @ coef - times) ** 2))
            if best is None or residual < best[0] - 1e-18:
                best = (residual, coef)
    assert best is not None  # a single free column's fit through non-negative times is never negative
    fixed, per_row, per_token = (float(value) for value in best[1])
    return StepCost(fixed, per_row, per_token)


def time_step(step: Callable[[], object], repeats: int, clock: Callable[[], float] = time.perf_counter) -> list[float]:
    """Seconds of each of ``repeats`` runs of ``step``, after one untimed run (lazy initialisation)."""
    step()
    times = []
    for _ in range(repeats):
        started = clock()
        step()
        times.append(clock() - started)
    return times


def spread(low: int, high: int, count: int = 3) -> tuple[int, ...]:
    """Up to ``count`` distinct sizes from ``low`` to ``high``, geometrically spaced (both ends included)."""
    if high <= low:
        return (low,)
    sizes = np.unique(np.round(np.geomspace(low, high, count)).astype(int))
    return tuple(int(size) for size in sizes)
