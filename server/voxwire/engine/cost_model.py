"""``StepCost``: how long one engine step takes, as a linear model of its work.

One definition serves three users: the simulated runner (``--model sim --sim-cost``) sleeps for it,
the virtual-time load simulator advances its clock by it, and the real-time scheduler budgets
admissions with it. A cost is written the way people say it, as a sum of terms::

    "4ms+0.17ms/row+9.2us/token"     a fixed part, a part per decode row, a part per prefill position
    "120ms+0.1ms/row"                no prefill term: admissions are free
    "4ms+0.17ms/row+18ms/substep@50" a sub-step at timestep bucket 50 costs 18 ms of its own

Each term is a number with a unit (``s``, ``ms``, ``us``) and an optional ``/row``, ``/token`` or
``/substep@T``; a kind (each bucket ``T`` its own) may appear once. Spaces are ignored. Anything else is a
``ValueError`` naming the bad term.

Sub-steps: a runner steps its rows in one sub-step per timestep bucket they fall in (``engine.runner``), and each
sub-step has a fixed cost of its own (its graph's launches, the weights it reads once whatever the rows). The
fitted ``fixed_s`` pays for one; a step whose rows fall in more buckets also pays each further bucket's sub-step
cost (``substep_s``, measured by ``engine.calibration``), the cheapest present counted as the one ``fixed_s`` pays.

A fit made at start-up says how fast the machine was then. ``TrackedStepCost`` is what the real-time scheduler
budgets with while it serves: the fit's shape, scaled by how much slower (or faster) the steps measured since run
than it predicts (the rule is stated once, on that class), so that a CPU shared with other work, a throttled
device or a noisy neighbour makes it admit less, and the machine's recovery makes it admit more again.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from voxwire.engine.timestep_buckets import bucket_of

_UNIT_SECONDS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
_TERM = re.compile(
    r"^(?P<value>\d+(?:\.\d*)?|\.\d+)(?P<unit>s|ms|us)(?:/(?P<per>row|token|substep@(?P<bucket>[1-9]\d*)))?$"
)


@dataclass(frozen=True, slots=True)
class StepCost:
    """Seconds per step = ``fixed_s + per_row_s * rows + per_token_s * prefill_tokens``, plus the sub-steps beyond
    the first (the module docstring)."""

    fixed_s: float = 0.0
    per_row_s: float = 0.0
    per_token_s: float = 0.0
    substep_s: tuple[tuple[int, float], ...] = ()
    """Each timestep bucket's sub-step fixed cost, as (bucket, seconds), buckets ascending; empty: every step is
    priced as one sub-step."""

    def __post_init__(self) -> None:
        named = [(name, getattr(self, name)) for name in ("fixed_s", "per_row_s", "per_token_s")]
        for name, value in [*named, *((f"substep_s[{bucket}]", value) for bucket, value in self.substep_s)]:
            if not value >= 0.0 or value == float("inf"):
                raise ValueError(f"StepCost.{name}={value!r} is invalid: must be a finite number >= 0")
        buckets = [bucket for bucket, _ in self.substep_s]
        if buckets != sorted(set(buckets)) or any(bucket < 1 for bucket in buckets):
            raise ValueError(
                f"StepCost.substep_s buckets {buckets} are invalid: must be distinct counts >= 1, ascending"
            )

    @classmethod
    def parse(cls, text: str) -> StepCost:
        """Read ``"4ms+0.17ms/row+9.2us/token"`` (see the module docstring)."""
        terms = text.replace(" ", "").split("+")
        if not text.strip() or any(not term for term in terms):
            raise ValueError(f"step cost {text!r} is invalid: expected terms like '4ms+0.17ms/row+9.2us/token'")
        parts: dict[str, float] = {}
        substeps: dict[int, float] = {}
        for term in terms:
            match = _TERM.match(term)
            if match is None:
                raise ValueError(
                    f"step cost term {term!r} is invalid: expected a number, a unit (s, ms, us) "
                    "and optionally /row or /token, e.g. '0.17ms/row'"
                )
            kind = match["per"] or "fixed"
            if kind in parts:
                raise ValueError(f"step cost {text!r} is invalid: more than one {kind} term")
            value = float(match["value"]) * _UNIT_SECONDS[match["unit"]]
            if match["bucket"] is None:
                parts[kind] = value
            else:
                substeps[int(match["bucket"])] = parts[kind] = value
        return cls(
            parts.get("fixed", 0.0), parts.get("row", 0.0), parts.get("token", 0.0), tuple(sorted(substeps.items()))
        )

    def seconds(self, rows: float, prefill_tokens: int = 0, timesteps: Iterable[int] = ()) -> float:
        """The modelled duration of a step decoding ``rows`` rows (weighted rows may be fractional), prefilling
        ``prefill_tokens``, its rows asking for these CFM ``timesteps`` counts (any order, repeats allowed;
        empty: priced as one sub-step)."""
        return (
            self.fixed_s + self.per_row_s * rows + self.per_token_s * prefill_tokens + self.extra_substeps_s(timesteps)
        )

    def extra_substeps_s(self, timesteps: Iterable[int]) -> float:
        """What the sub-steps of a step whose rows ask for ``timesteps`` cost beyond the one ``fixed_s`` pays: each
        bucket present's ``substep_s`` but the cheapest's (a count above the largest bucket runs in the largest)."""
        counts = np.fromiter(timesteps, dtype=np.int64)
        if not self.substep_s or counts.size < 2:
            return 0.0
        buckets = [bucket for bucket, _ in self.substep_s]
        costs = np.array([seconds for _, seconds in self.substep_s])
        present = costs[np.isin(buckets, bucket_of(buckets, np.minimum(counts, buckets[-1])))]
        return float(present.sum() - present.min()) if present.size > 1 else 0.0

    def __str__(self) -> str:
        terms = [f"{self.fixed_s * 1e3:g}ms"]
        if self.per_row_s:
            terms.append(f"{self.per_row_s * 1e3:g}ms/row")
        if self.per_token_s:
            terms.append(f"{self.per_token_s * 1e6:g}us/token")
        terms += [f"{seconds * 1e3:g}ms/substep@{bucket}" for bucket, seconds in self.substep_s]
        return "+".join(terms)


class CostModel(Protocol):
    """What the real-time policy budgets steps with: a ``StepCost`` or a ``TrackedStepCost``."""

    def seconds(self, rows: float, prefill_tokens: int = 0, timesteps: Iterable[int] = ()) -> float: ...


SLOWDOWN_WINDOW = 9
"""Steps whose measured/predicted ratios ``TrackedStepCost`` takes the median of: a slowdown shows in full after
five steps (a majority of the window), and up to four stray steps (a page fault, a garbage collection) move nothing."""
SLOWDOWN_BOUNDS = (0.5, 20.0)
"""The least and the most a measured/predicted ratio counts as: below 1, a fit made while the machine was busy
(start-up during another job) is corrected once it is quiet, within a factor the fit's shape can be trusted over;
the cap keeps one step stalled for seconds from reading as a machine thousands of times slower."""


class TrackedStepCost:
    """A start-up ``StepCost`` that follows the measured step time.

    The rule: a step's predicted duration is the fit's (``fit.seconds(rows, prefill_tokens)``) times the
    *slowdown*, the median of measured/predicted over the last ``SLOWDOWN_WINDOW`` steps that ran model work, each
    ratio clamped to ``SLOWDOWN_BOUNDS``. The window starts full of 1s (the fit is the first evidence), so on a
    machine that turns three times slower the prediction is three times the fit from the fifth slow step on, and
    back at the fit five steps after it recovers. Sans-I/O: the caller times its steps and feeds the durations
    (``observe``), on whatever clock it runs the engine by.
    """

    __slots__ = ("_ratios", "_slowdown", "fit")

    def __init__(self, fit: StepCost) -> None:
        self.fit = fit
        self._ratios: deque[float] = deque([1.0] * SLOWDOWN_WINDOW, maxlen=SLOWDOWN_WINDOW)
        self._slowdown = 1.0

    @property
    def slowdown(self) -> float:
        """The measured step time over the fit's prediction, as the rule above smooths it."""
        return self._slowdown

    def seconds(self, rows: float, prefill_tokens: int = 0, timesteps: Iterable[int] = ()) -> float:
        """The predicted duration of a step decoding ``rows`` rows and prefilling ``prefill_tokens`` positions, its
        rows asking for ``timesteps`` (``StepCost.seconds``)."""
        return self.fit.seconds(rows, prefill_tokens, timesteps) * self._slowdown

    def observe(self, rows: float, prefill_tokens: int, seconds: float, timesteps: Iterable[int] = ()) -> None:
        """A step that decoded ``rows`` (weighted) rows and prefilled ``prefill_tokens`` positions, its rows asking
        for ``timesteps``, took ``seconds``.

        Raises:
            ValueError: ``seconds`` is not a finite number >= 0.
        """
        if not (0 <= seconds < math.inf):
            raise ValueError(f"a step time of {seconds!r} s is invalid: must be a finite number >= 0")
        predicted = self.fit.seconds(rows, prefill_tokens, timesteps)
        if predicted <= 0:  # a fit that predicts nothing cannot say how much slower the step ran
            return
        low, high = SLOWDOWN_BOUNDS
        self._ratios.append(min(max(seconds / predicted, low), high))
        self._slowdown = statistics.median(self._ratios)
