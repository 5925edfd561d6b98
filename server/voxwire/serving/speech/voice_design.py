"""Voice design for a request: the control an utterance is spoken with, from its ``instructions`` and voice name.

On a model with voice design (VoxCPM2, ``ModelInfo.voice_design``), each of OpenAI's 13 voice names stands for
a written description of a voice (``OPENAI_VOICE_DESIGNS``); a request's ``instructions`` add to it, or make
the whole control with the default voice. ``text/design.py`` puts the control in front of the words.

A designed voice is a description, not a recording: the same description gives another timbre with another
seed, and the same one with the same seed (the same ``seed`` field, the same text).

The rules, as the reference's CLI has them (``voxcpm design``, ``clone --control``):

* a control goes with the default voice or a reference clip (a saved voice without a transcript), never
  with a continuation prompt (a saved voice made with its transcript): ``DesignRefused``;
* a model without voice design (VoxCPM 0.5B and 1.5, architecture ``voxcpm``) refuses ``instructions``
  (``DesignRefused``), and there the voice names keep meaning its default voice.
"""

from __future__ import annotations

from voxwire.errors import VoxwireError
from voxwire.prompt import VoicePrompt
from voxwire.speech_model import ModelInfo
from voxwire.text.design import clean_control, join_controls

OPENAI_VOICE_DESIGNS: dict[str, str] = {
    "alloy": "A neutral, balanced adult voice, clear and even, at a moderate pace",
    "ash": "A young adult male voice, relaxed and slightly husky, casual and conversational",
    "ballad": "A gentle male tenor voice, soft and melodic, unhurried and expressive",
    "coral": "A warm, bright female voice, friendly and upbeat, like a helpful guide",
    "echo": "A calm adult male voice, warm and resonant, steady and reassuring",
    "fable": "An articulate storyteller with a light British accent, expressive and lively",
    "nova": "An energetic young female voice, crisp and cheerful, quick and clear",
    "onyx": "A deep, low male voice, authoritative and composed, slow and measured",
    "sage": "A thoughtful, soft-spoken female voice, calm and wise, gentle pacing",
    "shimmer": "A soft, airy female voice, gentle and soothing, quiet and smooth",
    "verse": "A dynamic male voice, animated and theatrical, with varied intonation",
    "marin": "A natural, clear female voice, poised and professional, warm and conversational",
    "cedar": "A natural, grounded male voice, warm and mellow, conversational and sincere",
}
"""What each OpenAI voice name designs on a model with voice design (lowercase names, matched ignoring case)."""


class DesignRefused(VoxwireError):
    """A request's voice design this model or voice cannot take (the ``unsupported`` error code)."""


def utterance_control(
    info: ModelInfo, voice: str | None, prompt: VoicePrompt | None, instructions: str | None
) -> str | None:
    """The control an utterance is spoken with (None: no voice design), for a ``voice`` field that resolved to
    ``prompt`` (None: the default voice or a voice name) and a request's ``instructions``.

    Raises:
        DesignRefused: ``instructions`` on a model without voice design, or with a continuation prompt.
    """
    asked = clean_control(instructions)
    if not info.voice_design:
        if asked is not None:
            raise DesignRefused(f"'instructions' (voice design) needs a VoxCPM2 model; {info.name} has no voice design")
        return None
    if asked is not None and takes_continuation(prompt):
        raise DesignRefused(
            "'instructions' cannot be used with a voice saved with its transcript (a continuation prompt), as "
            "in the reference; use a voice saved without a transcript (a reference clip) or the default voice"
        )
    named = OPENAI_VOICE_DESIGNS.get(voice.lower()) if voice is not None and prompt is None else None
    return join_controls(named, asked)


def takes_continuation(prompt: VoicePrompt | None) -> bool:
    """Whether a voice continues a prompt (a transcript and its audio), which no control may go with."""
    return prompt is not None and prompt.audio_patches is not None


def design_allowed(info: ModelInfo, prompt: VoicePrompt | None) -> bool:
    """Whether an utterance in this voice may be designed at all (a typed ``(control)`` prefix is taken)."""
    return info.voice_design and not takes_continuation(prompt)
