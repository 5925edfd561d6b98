"""``EncoderPool``: runs stream encoders on worker threads so that audio coding stays off the event loop.

libopus does its work inside a ctypes call, which releases the GIL, so encoders on a few threads run in
parallel with the loop (and, with ``--workers``, one pool per frontend process spreads them over the
cores). Order within a stream is the caller's: await each call before making the next one on the same
encoder (a stream's chunks come one at a time anyway); different streams' calls interleave freely.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from voxwire.audio.formats import StreamEncoder


class EncoderPool:
    """``threads`` encoder threads; with 0, calls run inline on the event loop (tests, tiny servers)."""

    def __init__(self, threads: int) -> None:
        if threads < 0:
            raise ValueError(f"threads={threads} is invalid: must be >= 0")
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="voxwire-encoder") if threads else None

    async def encode(self, encoder: StreamEncoder, chunk: np.ndarray) -> list[bytes]:
        if self._executor is None:
            return encoder.encode(chunk)
        return await asyncio.get_running_loop().run_in_executor(self._executor, encoder.encode, chunk)

    async def finish(self, encoder: StreamEncoder) -> list[bytes]:
        if self._executor is None:
            return encoder.finish()
        return await asyncio.get_running_loop().run_in_executor(self._executor, encoder.finish)

    def close(self) -> None:
        """Let queued calls finish, then stop the threads (non-blocking)."""
        if self._executor is not None:
            self._executor.shutdown(wait=False)


INLINE = EncoderPool(0)
"""Encode on the calling thread: for sessions built outside an app (tests)."""
