"""Bookkeeping of the runner's state rows (KV cache and VAE state), kept compacted.

A running session owns one slot, and the occupied slots are always exactly ``0..n-1``: the runner
can then run every decode step on the leading ``[:n]`` rows of its static pool (fixed shapes per
batch bucket, CUDA graphs) without gathering. When a session leaves, the session in the highest
slot moves into the hole and the table returns that ``SlotMove`` for the runner to copy.
Pure Python: this module owns no tensors and does not decide who runs.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SlotMove:
    """Copy the state of row ``src`` into row ``dst`` (``src`` is free afterwards)."""

    src: int
    dst: int


class SlotTable:
    """Maps request ids to compacted slot indices ``0..num_used-1``."""

    def __init__(self, num_slots: int) -> None:
        if num_slots < 1:
            raise ValueError(f"num_slots={num_slots} is invalid: must be >= 1")
        self.num_slots = num_slots
        # owners[slot] is the request id in that slot; its length is the number of used slots.
        self._owners: list[str] = []
        self._slot_of: dict[str, int] = {}

    @property
    def num_used(self) -> int:
        return len(self._owners)

    @property
    def num_free(self) -> int:
        return self.num_slots - len(self._owners)

    @property
    def owners(self) -> tuple[str, ...]:
        """Request id per slot, slot 0 first."""
        return tuple(self._owners)

    def slot_of(self, request_id: str) -> int:
        return self._slot_of[request_id]

    def allocate(self, request_id: str) -> int:
        """Give ``request_id`` the lowest free slot (always ``num_used``) and return it."""
        if request_id in self._slot_of:
            raise ValueError(f"request {request_id!r} already owns slot {self._slot_of[request_id]}")
        if not self.num_free:
            raise RuntimeError(f"no free slot for request {request_id!r}: all {self.num_slots} are used")
        slot = len(self._owners)
        self._owners.append(request_id)
        self._slot_of[request_id] = slot
        return slot

    def release(self, request_id: str) -> SlotMove | None:
        """Free the slot of ``request_id``; return the move that refills the hole, if one is needed.

        Releasing several sessions highest slot first never moves a session that is itself about
        to be released, so that order yields the fewest copies.
        """
        slot = self._slot_of.pop(request_id)
        last_owner = self._owners.pop()
        if last_owner == request_id:
            return None
        self._owners[slot] = last_owner
        self._slot_of[last_owner] = slot
        return SlotMove(src=len(self._owners), dst=slot)
