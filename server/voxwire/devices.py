"""Which CUDA device a runner works on, and doing every device-wide call there.

``torch.cuda``'s device-wide calls (streams, memory statistics, ``mem_get_info``, graph capture, the
current device Triton launches on) act on the calling thread's *current* device, which is cuda:0 unless
set, whatever device the tensors live on. A runner on cuda:1 (``--devices cuda:0,cuda:1``) must
therefore name its device in each such call and run every step inside ``scope``; this module is where
that device is decided, once per runner, so a test can stand another device in for it
(``tests/engine/test_cuda_path_on_meta.py`` runs the CUDA path with meta tensors as cuda:1).
"""

from __future__ import annotations

import weakref
from collections.abc import Generator, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import TypeVar

import numpy as np
import torch


def cuda_device(device: torch.device) -> torch.device | None:
    """The CUDA device a runner on ``device`` works on, with its index (``cuda`` means the current device
    when the runner is made); None when ``device`` is not a CUDA device (no graphs, no pinned memory)."""
    if device.type != "cuda":
        return None
    return device if device.index is not None else torch.device("cuda", torch.cuda.current_device())


def scope(cuda: torch.device | None) -> AbstractContextManager[object]:
    """Make ``cuda`` the calling thread's current device for the block (nothing off CUDA)."""
    return nullcontext() if cuda is None else torch.cuda.device(cuda)


_T = TypeVar("_T")


def scoped(cuda: torch.device | None, items: Generator[_T, None, None]) -> Generator[_T, None, None]:
    """``items``, each made with ``cuda`` current (``scope``) and handed over with the caller's device current
    again: a generator that runs the model (``VoxCPM.stream``) runs on its device, whatever thread pulls it."""
    try:
        while True:
            with scope(cuda):
                try:
                    item = next(items)
                except StopIteration:
                    return
            yield item
    finally:
        with scope(cuda):
            items.close()


def side_stream(cuda: torch.device | None) -> torch.cuda.Stream | None:
    """A new stream on ``cuda`` for work off the engine's thread (voice encoding), so that it and the engine's
    steps do not queue behind each other on one stream; it first waits for everything already queued on the
    current stream (the model's weights being loaded). None off CUDA."""
    if cuda is None:
        return None
    stream = torch.cuda.Stream(cuda)
    stream.wait_stream(torch.cuda.current_stream(cuda))
    return stream


def on_stream(stream: torch.cuda.Stream | None) -> AbstractContextManager[object]:
    """Make ``stream`` the calling thread's current stream for the block (nothing for None)."""
    return nullcontext() if stream is None else torch.cuda.stream(stream)


def host_buffer(shape: tuple[int, ...], dtype: torch.dtype, cuda: torch.device | None) -> torch.Tensor:
    """An uninitialised host tensor, page-locked when it will be copied to or from ``cuda`` (so the copy can
    be asynchronous and needs no staging copy of its own)."""
    return torch.empty(shape, dtype=dtype, pin_memory=cuda is not None)


class HostOutputs:
    """Host buffers of ``shape`` that device outputs are read into, each reused once nothing views what it was
    last lent for: a step's chunks are views of its buffer (no copy), and a fresh page-locked buffer per step
    would pin one more block for every step a slow consumer still holds."""

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype, cuda: torch.device | None) -> None:
        self.shape, self.dtype, self.cuda = shape, dtype, cuda
        # Each buffer with the array it was last lent as (weakly: alive while any chunk views it).
        self._buffers: list[tuple[torch.Tensor, weakref.ref[np.ndarray] | None]] = []

    def take(self) -> int:
        """The index of a buffer nothing views (made when every one is still viewed)."""
        for index, (_, lent) in enumerate(self._buffers):
            if lent is None or lent() is None:
                return index
        self._buffers.append((host_buffer(self.shape, self.dtype, self.cuda), None))
        return len(self._buffers) - 1

    def buffer(self, index: int) -> torch.Tensor:
        return self._buffers[index][0]

    def lend(self, index: int) -> np.ndarray:
        """Buffer ``index`` as an array; the buffer is not taken again while any view of the array lives."""
        buffer = self._buffers[index][0]
        array = buffer.numpy()
        self._buffers[index] = (buffer, weakref.ref(array))
        return array

    @property
    def count(self) -> int:
        """How many buffers exist (each made when all the others were still viewed)."""
        return len(self._buffers)


def upload(tensors: Sequence[torch.Tensor], device: torch.device, cuda: torch.device | None) -> list[torch.Tensor]:
    """``tensors`` (on the host) on ``device``. On CUDA with one copy: packed into one page-locked buffer (each
    at a 16-byte aligned offset), copied asynchronously, and viewed back with each tensor's dtype and shape,
    instead of one pageable copy (and wait) per tensor. The host buffer is recycled by torch's pinned-memory
    allocator only once the copy has run."""
    if cuda is None:
        return [tensor.to(device) for tensor in tensors]
    parts = [tensor.contiguous().reshape(-1).view(torch.uint8) for tensor in tensors]
    offsets, total = [], 0
    for part in parts:
        offsets.append(total)
        total += -(-part.numel() // 16) * 16
    host = host_buffer((max(total, 16),), torch.uint8, cuda)
    for part, offset in zip(parts, offsets, strict=True):
        host[offset : offset + part.numel()].copy_(part)
    staged = host.to(device, non_blocking=True)
    return [
        staged[offset : offset + part.numel()].view(tensor.dtype).view(tensor.shape)
        for tensor, part, offset in zip(tensors, parts, offsets, strict=True)
    ]
