"""Measuring a runner's ``StepCost``: which steps to time, timing them, and fitting the linear model to them.

``measure_step_cost`` times decode steps at a few batch sizes and admission steps (one prefill, then its row
decoded, as the engine runs them) at a few prompt lengths and with a continuation prompt (which LocEnc encodes and
the VAE is warmed with at admission), all at the default timestep count, and fits a
``StepCost``; then it times the largest batch at every timestep bucket for each bucket's row weight (its per-row
cost over the default's), which the real-time policy weighs rows by, and one row at every bucket for the bucket's
sub-step fixed cost (``StepCost.substep_s``: a step whose rows fall in two buckets runs two sub-steps). The
runner supplies the steps (``CalibrationTarget``); what to time and how to read the timings is decided here.

The fit is non-negative least squares over ``fixed + per_row * rows + per_token * prefill_tokens``,
on the median of each shape's repeated timings: the median shrugs off a stray slow run (a page fault,
another process on the device), and a coefficient the data would make negative (noise on a term
that costs next to nothing) is pinned at zero and the others refitted, so the model never promises
a step cheaper than nothing.
"""

from __future__ import annotations

import dataclasses
import itertools
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from voxwire.engine.blocks import blocks_for
from voxwire.engine.cost_model import StepCost
from voxwire.engine.outputs import PrefillItem
from voxwire.engine.request import Prepared, Request
from voxwire.engine.timestep_buckets import bucket_of
from voxwire.params import SynthesisParams
from voxwire.prompt import VoicePrompt
from voxwire.startup import Progress

CALIBRATION_SLOT = 0
"""The slot admissions are timed in; their KV blocks are the pool's first (block 0 is the null block)."""
_LONGEST_PROMPT = 256
"""Positions of the longest timed prompt: a long sentence with a voice prompt."""
_CONTINUATION_PATCHES = 32
"""Audio patches of the timed continuation prompt: a stream's previous sentence (15-60 patches), which the admission
encodes with LocEnc (a new voice each sentence: the voice cache cannot hold it) and warms the VAE with."""


class CalibrationTarget(Protocol):
    """A runner before it serves, as calibration times it. Its idle rows (rows that hold no request) run decode
    steps of any batch size, and admissions run in ``CALIBRATION_SLOT`` and the first KV blocks, which the runner
    frees after calibration."""

    @property
    def num_slots(self) -> int: ...

    @property
    def num_kv_blocks(self) -> int: ...

    @property
    def block_size(self) -> int: ...

    @property
    def max_length(self) -> int: ...

    @property
    def patch_shape(self) -> tuple[int, int]:
        """(patch_size, feat_dim): the shape of one latent patch of a voice prompt's audio."""
        ...

    @property
    def timestep_counts(self) -> tuple[int, ...]:
        """The timestep buckets, ascending (``engine.timestep_buckets``)."""
        ...

    def idle_step(self, rows: int, timesteps: int) -> tuple[int, Callable[[], object]]:
        """The rows a decode step of ``rows`` idle rows really runs (a CUDA graph's batch bucket), and that step;
        the idle rows run ``timesteps`` CFM timesteps from now on."""
        ...

    def admission_step(self, item: PrefillItem) -> Callable[[], object]:
        """The admission of ``item`` as the engine runs it: its prefill, then its row's first decode step."""
        ...

    def prepare(self, request: Request) -> Prepared:
        """The request laid out as the engine's ``add`` has it laid out (``Runner.prepare``)."""
        ...


def measure_step_cost(
    target: CalibrationTarget, repeats: int = 3, clock: Callable[[], float] = time.perf_counter
) -> tuple[StepCost, dict[int, float]]:
    """The target's fitted ``StepCost`` and each timestep bucket's row weight (see the module docstring)."""
    default = SynthesisParams().inference_timesteps
    decodes = dict(target.idle_step(rows, default) for rows in spread(1, target.num_slots))
    admissions = _admissions(target, default, runs=repeats + 1)
    # Every shape below is run repeats + 1 times (one untimed); the log says how far the fit is.
    shapes = len(decodes) + len(admissions) + 2 * len(target.timestep_counts)
    progress = Progress("timed steps of the step-cost fit", shapes * (repeats + 1))
    samples: list[CostSample] = []
    for rows, step in sorted(decodes.items()):
        samples += [CostSample(rows, 0, seconds) for seconds in time_step(step, repeats, clock, progress)]
    for items, tokens in admissions:
        step = _in_turn([target.admission_step(item) for item in items])
        samples += [CostSample(1, tokens, seconds) for seconds in time_step(step, repeats, clock, progress)]
    cost = fit_step_cost(samples)
    per_row: dict[int, float] = {}
    for count in target.timestep_counts:  # the default's bucket is one of them
        _, largest = target.idle_step(target.num_slots, count)
        seconds = float(np.median(time_step(largest, repeats, clock, progress)))
        per_row[count] = max(seconds - cost.fixed_s, 1e-9) / target.num_slots
    unit = per_row[int(bucket_of(target.timestep_counts, default))]
    substeps = []
    for count in target.timestep_counts:
        # A step of one row in the bucket is its sub-step's fixed cost and that one row.
        rows, smallest = target.idle_step(1, count)
        seconds = float(np.median(time_step(smallest, repeats, clock, progress)))
        substeps.append((count, max(seconds - per_row[count] * rows, 0.0)))
    weights = {count: per_row[count] / unit for count in target.timestep_counts}
    return dataclasses.replace(cost, substep_s=tuple(substeps)), weights


def _in_turn(steps: list[Callable[[], object]]) -> Callable[[], object]:
    """A step that runs the next of ``steps`` each time (the first again after the last)."""
    turns = itertools.cycle(steps)
    return lambda: next(turns)()


def _admissions(target: CalibrationTarget, timesteps: int, runs: int) -> list[tuple[tuple[PrefillItem, ...], int]]:
    """Admissions of a few prompt lengths up to ``_LONGEST_PROMPT`` positions that fit a slot and the pool, and one
    with a continuation prompt of ``_CONTINUATION_PATCHES`` patches (fewer where it does not fit), each with its
    prompt length; none when even a short prompt does not fit (decode samples only). The continuation's ``runs``
    items each carry another voice, as every sentence of a stream does; the others' item is run each time."""
    params = SynthesisParams(max_len=1, min_len=0, seed=0, inference_timesteps=timesteps)

    def admission(words: int, prompt: VoicePrompt | None = None) -> tuple[Request, Prepared]:
        made = Request("calibration", " ".join(["calibrate"] * words), params, prompt=prompt)
        return made, target.prepare(made)

    (_, short), (_, longer) = admission(8), admission(16)
    if short.error is not None or longer.error is not None:
        return []
    per_word = max((longer.prompt_positions - short.prompt_positions) / 8, 1e-9)
    room = min(target.max_length, (target.num_kv_blocks - 1) * target.block_size) - 1

    def fitting(made: Request, prepared: Prepared) -> PrefillItem | None:
        if prepared.error is not None or prepared.prompt_positions > room:
            return None
        blocks = tuple(range(1, 1 + blocks_for(prepared.prompt_positions + 1, target.block_size)))
        return PrefillItem("calibration", CALIBRATION_SLOT, made, prepared, blocks)

    items: list[tuple[tuple[PrefillItem, ...], int]] = []
    for wanted in spread(short.prompt_positions, min(_LONGEST_PROMPT, room)):
        item = fitting(*admission(max(1, round(8 + (wanted - short.prompt_positions) / per_word))))
        if item is not None:
            items.append(((item,), item.prepared.prompt_positions))
    for patches in (_CONTINUATION_PATCHES, 1):
        # Voice ``run`` is patches of the value run / 100: another voice each run, latents of a plausible size.
        voices = [
            VoicePrompt("calibrate", np.full((patches, *target.patch_shape), run / 100, dtype=np.float32))
            for run in range(runs)
        ]
        continued = [item for voice in voices if (item := fitting(*admission(8, voice))) is not None]
        if len(continued) == runs:
            items.append((tuple(continued), continued[0].prepared.prompt_positions))
            break
    return items


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


def time_step(
    step: Callable[[], object],
    repeats: int,
    clock: Callable[[], float] = time.perf_counter,
    progress: Progress | None = None,
) -> list[float]:
    """Seconds of each of ``repeats`` runs of ``step``, after one untimed run (lazy initialisation); each run
    advances ``progress``."""
    step()
    times = []
    for _ in range(repeats):
        if progress is not None:
            progress.advance()
        started = clock()
        step()
        times.append(clock() - started)
    if progress is not None:
        progress.advance()
    return times


def spread(low: int, high: int, count: int = 3) -> tuple[int, ...]:
    """Up to ``count`` distinct sizes from ``low`` to ``high``, geometrically spaced (both ends included)."""
    if high <= low:
        return (low,)
    sizes = np.unique(np.round(np.geomspace(low, high, count)).astype(int))
    return tuple(int(size) for size in sizes)
