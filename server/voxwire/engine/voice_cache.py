"""``VoiceCache``: the encoded audio of recently used voices, so sessions that share a voice do not run
LocEnc over its patches again.

What is cached, and why nothing more: a voice's audio positions (its reference clip, then its prompt
audio; spec section 4.3) are the only positions of a prefill that LocEnc runs on, and each position's
embedding depends on its own patch alone, so the LM-space embeddings of a voice's patches are the same
in every sequence the voice appears in. The LMs' keys and values are not cached: in the continuation
layouts the voice's transcript is tokenized together with the target text and its audio comes after
that text, so no position's keys depend on the voice alone. Only the v2 reference layout starts with
voice-only positions (``103 R 104``); sharing that KV prefix would need a prefill that starts from a
cached prefix, which the model does not have yet.

Entries are keyed by ``VoicePrompt.digest`` (the content of its patches, so one voice loaded twice
shares an entry and a freed voice's key cannot be reused by another), bounded by bytes and evicted
least recently used first. The runner owns the cache and the engine thread is the runner's only
caller, so it takes no lock.
"""

from __future__ import annotations

from collections import OrderedDict

import torch


class VoiceCache:
    """Voice digest -> (N, H) embeddings of the voice's patches on the model's device, LRU within a byte budget."""

    def __init__(self, capacity_bytes: int) -> None:
        if capacity_bytes < 0:
            raise ValueError(f"capacity_bytes={capacity_bytes} is invalid: must be >= 0 (0 disables the cache)")
        self.capacity_bytes = capacity_bytes
        self.nbytes = 0
        self._entries: OrderedDict[str, torch.Tensor] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, digest: str) -> torch.Tensor | None:
        """The voice's embeddings, now the most recently used entry; None if not cached."""
        embeds = self._entries.get(digest)
        if embeds is not None:
            self._entries.move_to_end(digest)
        return embeds

    def put(self, digest: str, embeds: torch.Tensor) -> None:
        """Keep ``embeds`` under ``digest``, evicting the least recently used entries until it fits; an
        entry larger than the whole budget is not kept."""
        size = embeds.nbytes
        if size > self.capacity_bytes or digest in self._entries:
            return
        while self.nbytes + size > self.capacity_bytes:
            _, evicted = self._entries.popitem(last=False)
            self.nbytes -= evicted.nbytes
        self._entries[digest] = embeds
        self.nbytes += size
