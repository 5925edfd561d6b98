"""VoxCPM2's voice design as text: a description of the voice in parentheses before the words to speak.

The reference builds ``f"({control}){text}"`` from a control stripped of surrounding spaces, and no prefix at
all for an empty one (its CLI's ``design`` and ``clone --control``); ``designed_text`` does the same. A
control may not itself hold a parenthesis, which would end it early and have the rest read aloud, so
``clean_control`` drops them (as the reference's web demo does) and folds its whitespace.
"""

from __future__ import annotations

_PARENTHESES = str.maketrans("", "", "()")


def clean_control(control: str | None) -> str | None:
    """``control`` without parentheses, its whitespace folded to single spaces; None when nothing is left."""
    if control is None:
        return None
    cleaned = " ".join(control.translate(_PARENTHESES).split())
    return cleaned or None


def designed_text(control: str | None, text: str) -> str:
    """The text the model is given for ``text`` spoken with the voice ``control`` describes (None: as is)."""
    return f"({control}){text}" if control else text


def join_controls(*controls: str | None) -> str | None:
    """Several descriptions as one control (a voice's own, then a request's instructions), in order."""
    parts = [control.rstrip(" .;,") for control in controls if control]
    return "; ".join(part for part in parts if part) or None  # "..." alone would leave a dangling "; "
