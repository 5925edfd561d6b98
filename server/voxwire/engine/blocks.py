"""Bookkeeping of the KV block pool: which blocks are free. Pure Python, no tensors.

The runner's base-LM and residual-LM caches share one block id space: block i of both belongs to the
same session. Block 0 is the runner's null block and is never handed out.

The rule that keeps running streams safe: a session is given, at admission, every block it can reach
(its prompt plus its length cap, both known when it is added). A running stream therefore never waits
for or fails on a block; when the pool is short, admission waits instead (``Scheduler``). A session
that stops early returns its unused blocks when it finishes.
"""

from __future__ import annotations


def blocks_for(positions: int, block_size: int) -> int:
    """Blocks that hold ``positions`` positions."""
    return -(-positions // block_size)


class BlockAllocator:
    """Hands out block ids ``1 .. num_blocks-1``."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 2 or block_size < 1:
            raise ValueError(f"a block pool needs >= 2 blocks of >= 1 position, got {num_blocks} x {block_size}")
        self.block_size = block_size
        self.num_total = num_blocks - 1  # without the null block
        # Popped from the end: recently freed blocks are reused first (they are likely still cached).
        self._free = list(range(num_blocks - 1, 0, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_total - len(self._free)

    def blocks_for(self, positions: int) -> int:
        return blocks_for(positions, self.block_size)

    def can_allocate(self, count: int) -> bool:
        return count <= len(self._free)

    def allocate(self, count: int) -> tuple[int, ...]:
        if count > len(self._free):
            raise RuntimeError(f"{count} KV blocks asked for, {len(self._free)} free (admission must check first)")
        taken = self._free[len(self._free) - count :]
        del self._free[len(self._free) - count :]
        return tuple(reversed(taken))

    def free(self, blocks: tuple[int, ...]) -> None:
        self._free.extend(reversed(blocks))
