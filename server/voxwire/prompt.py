"""Voices: ``VoicePrompt``, a voice encoded once into latent patches and reused by any number of utterances: a
continuation prompt (transcript + audio, every version), a reference clip (isolated cloning, ``voxcpm2`` only),
or both.

Numpy only, no torch: a ``--workers`` frontend keeps, stores, continues and sends voices without the model
stack; the engine's runner turns a prompt's patches into tensors where it lays out a request
(``voxwire.sequence``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import numpy.typing as npt

from voxwire.errors import InvalidInputError

Patches = npt.NDArray[np.float32]
"""(N, patch_size, feat_dim) float32 latent patches."""

MAX_LATENT_MAGNITUDE = 1e3
"""Largest ``|value|`` of a prompt's latent patches accepted: VAE latents are O(10), and finite but huge ones
(3e38, say) drive the model to NaN or to silence up to the length cap."""


@dataclass(frozen=True)
class VoicePrompt:
    """A voice as latent patches, float32 arrays (given as anything numpy reads as one, a CPU tensor too).
    Immutable: extend it with ``continued``."""

    text: str = ""
    audio_patches: Patches | None = None  # (Np, P, D) continuation audio, spoken as ``text``
    reference_patches: Patches | None = None  # (Nr, P, D) v2 reference clip

    def __post_init__(self) -> None:
        if self.audio_patches is None and self.text:
            raise InvalidInputError("a prompt transcript needs its prompt audio")
        if self.audio_patches is None and self.reference_patches is None:
            raise InvalidInputError("a voice prompt needs prompt audio, a reference clip, or both")
        # Every prompt is built here (encoded clips, voices read from disk, continuations), so this is the one
        # gate that keeps non-finite or absurd latents out of the model, where they would poison the batch row.
        for what, field in (("prompt audio", "audio_patches"), ("reference", "reference_patches")):
            value = getattr(self, field)
            if value is None:
                continue
            patches = np.asarray(value, dtype=np.float32)  # the same object when it already is one
            object.__setattr__(self, field, patches)
            if not bool(np.isfinite(patches).all()):
                raise InvalidInputError(f"the {what} latents are not finite (the clip is not usable audio)")
            if patches.size and float(np.abs(patches).max()) > MAX_LATENT_MAGNITUDE:
                raise InvalidInputError(
                    f"the {what} latents reach |{float(np.abs(patches).max()):.3g}|, above {MAX_LATENT_MAGNITUDE:g} "
                    "(VAE latents are O(10): these are not an encoded clip)"
                )

    def __reduce__(self) -> tuple[object, tuple[str, Patches | None, Patches | None]]:
        # Pickled (the engine socket) through a builder the engine protocol allows by name: the default would
        # restore the fields without running the gate above.
        return prompt_from_arrays, (self.text, self.audio_patches, self.reference_patches)

    @cached_property
    def digest(self) -> str:
        """A digest of the voice's patches (not of its transcript, which LocEnc never sees), computed once per
        voice object: what a runner's voice cache is keyed by."""
        digest = hashlib.blake2b(digest_size=16)
        for name, patches in (("reference", self.reference_patches), ("audio", self.audio_patches)):
            if patches is not None:
                values = np.ascontiguousarray(patches)
                digest.update(f"{name}{tuple(values.shape)}".encode())
                digest.update(values.data)
        return digest.hexdigest()

    def continued(self, text: str, patches: Patches) -> VoicePrompt:
        """This voice followed by an utterance just generated (text and its (N, P, D) patches), so the next
        utterance continues the same voice. The reference clip, if any, is kept."""
        audio = patches if self.audio_patches is None else np.concatenate([self.audio_patches, patches])
        return VoicePrompt(self.text + text, audio, self.reference_patches)


def prompt_from_arrays(text: str, audio: Patches | None, reference: Patches | None) -> VoicePrompt:
    """A ``VoicePrompt`` from float32 arrays of (N, P, D) patches (how one is unpickled: anything else is
    refused, so a frame cannot smuggle another type in)."""
    for patches in (audio, reference):
        if patches is not None and (
            not isinstance(patches, np.ndarray) or patches.dtype != np.float32 or patches.ndim != 3
        ):
            raise InvalidInputError("a voice prompt's patches are float32 arrays of (N, P, D)")
    return VoicePrompt(text, audio, reference)
