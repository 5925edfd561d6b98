"""``StepCost``: how long one engine step takes, as a linear model of its work.

One definition serves three users: the simulated runner (``--model sim --sim-cost``) sleeps for it,
the virtual-time load simulator advances its clock by it, and the real-time scheduler budgets
admissions with it. A cost is written the way people say it, as a sum of terms::

    "4ms+0.17ms/row+9.2us/token"     a fixed part, a part per decode row, a part per prefill position
    "120ms+0.1ms/row"                no prefill term: admissions are free

Each term is a number with a unit (``s``, ``ms``, ``us``) and an optional ``/row`` or ``/token``; a
kind may appear once. Spaces are ignored. Anything else is a ``ValueError`` naming the bad term.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

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
