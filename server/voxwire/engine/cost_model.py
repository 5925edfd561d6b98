"""``StepCost``: how long one engine step takes, as a linear model of its work.

One definition serves three users: the simulated runner (``--model sim --sim-cost``) sleeps for it,
the virtual-time load simulator advances its clock by it, and the real-time scheduler budgets
admissions with it. A cost is written the way people say it, as a sum of terms::

    "4ms+0.17ms/row+9.2us/token"     a fixed part, a part per decode row, a part per prefill position
    "120ms+0.1ms/row"                no prefill term: admissions are free

Each term is a number with a unit (``s``, ``ms``, ``us``) and an optional ``/row`` or ``/token``; a
kind may appear once. Spaces are ignored. Anything else is a ``ValueError`` naming the bad term.

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
from dataclasses import dataclass
from typing import Protocol

_UNIT_SECONDS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
_TERM = re.compile(r"^(?P<value>\d+(?:\.\d*)?|\.\d+)(?P<unit>s|ms|us)(?:/(?P<per>row|token))?$")


@dataclass(frozen=True, slots=True)
class StepCost:
    """Seconds per step = ``fixed_s + per_row_s * rows + per_token_s * prefill_tokens``."""

    fixed_s: float = 0.0
    per_row_s: float = 0.0
    per_token_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("fixed_s", "per_row_s", "per_token_s"):
            value = getattr(self, name)
            if not value >= 0.0 or value == float("inf"):
                raise ValueError(f"StepCost.{name}={value!r} is invalid: must be a finite number >= 0")

    @classmethod
    def parse(cls, text: str) -> StepCost:
        """Read ``"4ms+0.17ms/row+9.2us/token"`` (see the module docstring)."""
        terms = text.replace(" ", "").split("+")
        if not text.strip() or any(not term for term in terms):
            raise ValueError(f"step cost {text!r} is invalid: expected terms like '4ms+0.17ms/row+9.2us/token'")
        parts: dict[str, float] = {}
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
            parts[kind] = float(match["value"]) * _UNIT_SECONDS[match["unit"]]
        return cls(parts.get("fixed", 0.0), parts.get("row", 0.0), parts.get("token", 0.0))

    def seconds(self, rows: float, prefill_tokens: int = 0) -> float:
        """The modelled duration of a step decoding ``rows`` rows (weighted rows may be fractional) and
        prefilling ``prefill_tokens``."""
        return self.fixed_s + self.per_row_s * rows + self.per_token_s * prefill_tokens

    def __str__(self) -> str:
        terms = [f"{self.fixed_s * 1e3:g}ms"]
        if self.per_row_s:
            terms.append(f"{self.per_row_s * 1e3:g}ms/row")
        if self.per_token_s:
            terms.append(f"{self.per_token_s * 1e6:g}us/token")
        return "+".join(terms)


class CostModel(Protocol):
    """What the real-time policy budgets steps with: a ``StepCost`` or a ``TrackedStepCost``."""

    def seconds(self, rows: float, prefill_tokens: int = 0) -> float: ...


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

    def seconds(self, rows: float, prefill_tokens: int = 0) -> float:
        """The predicted duration of a step decoding ``rows`` rows and prefilling ``prefill_tokens`` positions."""
        return self.fit.seconds(rows, prefill_tokens) * self._slowdown

    def observe(self, rows: float, prefill_tokens: int, seconds: float) -> None:
        """A step that decoded ``rows`` (weighted) rows and prefilled ``prefill_tokens`` positions took ``seconds``.

        Raises:
            ValueError: ``seconds`` is not a finite number >= 0.
        """
        if not (0 <= seconds < math.inf):
            raise ValueError(f"a step time of {seconds!r} s is invalid: must be a finite number >= 0")
        predicted = self.fit.seconds(rows, prefill_tokens)
        if predicted <= 0:  # a fit that predicts nothing cannot say how much slower the step ran
            return
        low, high = SLOWDOWN_BOUNDS
        self._ratios.append(min(max(seconds / predicted, low), high))
        self._slowdown = statistics.median(self._ratios)
