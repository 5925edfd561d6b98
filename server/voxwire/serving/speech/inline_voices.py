"""``InlineVoices``: voices made from clips that requests carry (``ref_audio``), kept encoded by the clip's content.

A clip sent with every request of a conversation (vLLM-Omni's per-request cloning) would otherwise be decoded and
encoded by the VAE each time: the first request pays that (under the voice-job slots, as an upload does), the next
ones find the encoded voice here. The key is a digest of the clip's bytes and its transcript (a transcript makes a
continuation prompt, none a reference clip: two voices of one clip). The engine's ``VoiceCache`` then keeps the
voice's LocEnc embeddings by the patches' digest, as for a saved voice.

Entries are bounded by count (``--inline-voices``) and dropped least recently used first; a process of ``--workers``
keeps its own. Use it from one event loop.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

from voxwire.prompt import VoicePrompt


def clip_key(clip: bytes, transcript: str | None) -> str:
    """The cache key of ``clip`` (an audio file's bytes) spoken with ``transcript`` (None: a reference clip)."""
    digest = hashlib.blake2b(clip, digest_size=16)
    digest.update(b"\x00reference" if transcript is None else b"\x01" + transcript.encode("utf-8"))
    return digest.hexdigest()


@dataclass
class InlineVoiceStats:
    """What the cache has done since the server started."""

    encoded: int = 0
    """Clips decoded and encoded (a miss)."""
    reused: int = 0
    """Requests whose clip was found encoded (a hit)."""


class InlineVoices:
    """Clip key (``clip_key``) -> the voice encoded from it, least recently used dropped beyond ``capacity``."""

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"capacity={capacity} is invalid: must be >= 0 (0 keeps none)")
        self.capacity = capacity
        self.stats = InlineVoiceStats()
        self._voices: OrderedDict[str, VoicePrompt] = OrderedDict()

    def __len__(self) -> int:
        return len(self._voices)

    def get(self, key: str) -> VoicePrompt | None:
        """The voice encoded from the clip of ``key``, now the most recently used; None if not kept."""
        voice = self._voices.get(key)
        if voice is not None:
            self._voices.move_to_end(key)
            self.stats.reused += 1
        return voice

    def put(self, key: str, voice: VoicePrompt) -> None:
        """Keep a freshly encoded voice (counted as encoded), dropping the least recently used beyond capacity."""
        self.stats.encoded += 1
        if self.capacity == 0:
            return
        self._voices[key] = voice
        self._voices.move_to_end(key)
        while len(self._voices) > self.capacity:
            self._voices.popitem(last=False)
