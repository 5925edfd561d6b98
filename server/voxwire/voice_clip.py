"""``VoiceClip``: the audio a voice is made from, before it is encoded into a ``VoicePrompt``.

One value names what every voice encoder takes (``SpeechModel.make_prompt``, ``Speaker.encode_voice``, the
engine process's ``EncodeVoice``): a continuation prompt (a clip and its transcript), a reference clip
(isolated cloning, ``voxcpm2``), or both. A leaf module (no torch, no model): frontends build and pickle it.
"""

from __future__ import annotations

from dataclasses import dataclass

from voxwire.audio.clip import AudioSource
from voxwire.errors import InvalidInputError


@dataclass(frozen=True)
class VoiceClip:
    """A voice to encode. Each source is a path, the bytes of an audio file, or an array at its rate.

    Raises ``InvalidInputError`` unless it holds prompt text and audio together, a reference clip, or both.
    """

    text: str | None = None
    """The transcript of ``audio`` (a continuation prompt); given with ``audio`` or not at all."""
    audio: AudioSource | None = None
    """The continuation clip: the new utterance continues it."""
    sample_rate: int | None = None
    """The rate of ``audio`` when it is an array (files carry their own)."""
    reference_audio: AudioSource | None = None
    """A reference clip (isolated cloning, ``voxcpm2`` only): the voice without continuing its words."""
    reference_sample_rate: int | None = None
    """The rate of ``reference_audio`` when it is an array."""

    def __reduce__(self) -> tuple[type[VoiceClip], tuple[object, ...]]:
        # Unpickled (the engine socket) through the constructor, so its checks run on what a frontend sent.
        return type(self), (self.text, self.audio, self.sample_rate, self.reference_audio, self.reference_sample_rate)

    def __post_init__(self) -> None:
        if (self.text is None) != (self.audio is None):
            raise InvalidInputError("prompt text and prompt audio must be given together")
        if self.audio is None and self.reference_audio is None:
            raise InvalidInputError("give prompt text and audio, or reference audio")
