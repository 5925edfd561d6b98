"""``SynthesisParams``: per-request generation settings, shared by the one-utterance API, the engine and
the server. A leaf module (no torch, no engine; the seed's bound is the wire protocol's ``MAX_SEED``, standard
library only), so any layer may import it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from voxwire.errors import InvalidInputError
from voxwire.protocol.wire import MAX_SEED, is_finite_number

_SHOWN_CHARS = 40
"""A refused value is quoted in the error up to this many characters (a client may send a 400-digit number)."""


def require(ok: bool, name: str, value: object, rule: str) -> None:
    """Raise ``InvalidInputError`` naming ``name`` and its ``rule`` unless ``ok``."""
    if not ok:
        shown = _shown(value)
        raise InvalidInputError(f"{name}={shown} is invalid: {rule}")


def _shown(value: object) -> str:
    try:
        text = repr(value)
    except ValueError:  # an int beyond Python's digit limit for str()
        return "<a number too large to show>"
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 3] + "..."


def is_int(value: object) -> bool:
    # bool is an int subclass, but True as a step count is always a caller's mistake.
    return isinstance(value, int) and not isinstance(value, bool)

    try:
        return math.isfinite(value)
    except OverflowError:
        return False


@dataclass(frozen=True, slots=True)
class SynthesisParams:
    """Per-request generation settings; defaults are the reference ``VoxCPM.generate`` defaults.

    ``__post_init__`` rejects values no server could accept; the server-configurable upper bounds
    are checked by ``ParamLimits.check`` when the request is added to an engine.
    """

    cfg_value: float = 2.0
    """Classifier-free guidance scale of the local diffusion."""
    inference_timesteps: int = 10
    """Euler steps of the diffusion sampler per patch."""
    min_len: int = 2
    """The stop head is ignored while the step index is <= min_len."""
    max_len: int = 4096
    """Hard cap on patches (steps); the runner lowers it further from the text length."""
    seed: int | None = None
    """Noise seed for reproducible output; None draws a fresh one."""

    def __reduce__(self) -> tuple[type[SynthesisParams], tuple[object, ...]]:
        # Unpickled (the engine socket) through the constructor, so its checks run on what a frontend sent.
        return type(self), tuple(getattr(self, field.name) for field in fields(self))

    def __post_init__(self) -> None:
        cfg = self.cfg_value
        require(isinstance(cfg, (int, float)) and not isinstance(cfg, bool), "cfg_value", cfg, "must be a number")
        require(is_finite_number(cfg), "cfg_value", cfg, "must be finite")
        require(is_int(self.inference_timesteps), "inference_timesteps", self.inference_timesteps, "must be an int")
        require(self.inference_timesteps >= 1, "inference_timesteps", self.inference_timesteps, "must be >= 1")
        require(is_int(self.min_len) and self.min_len >= 0, "min_len", self.min_len, "must be an int >= 0")
        require(is_int(self.max_len) and self.max_len >= 1, "max_len", self.max_len, "must be an int >= 1")
        seed_ok = self.seed is None or (is_int(self.seed) and 0 <= self.seed < MAX_SEED)
        require(seed_ok, "seed", self.seed, "must be None or an int in [0, 2**63)")
