"""Encoders run off the event loop, and every stream's output is what encoding it alone gives."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from voxwire.audio.formats import make_encoder
from voxwire.serving.runtime.encoding import EncoderPool
from voxwire.sim.model import speech_clip

CHUNK = 7680


def chunks(stream: int) -> list[np.ndarray]:
    clip = speech_clip(48000)
    start = stream * 9000
    return [clip[start + i * CHUNK : start + (i + 1) * CHUNK] for i in range(6)]


def alone(stream: int) -> list[bytes]:
    encoder = make_encoder("opus", 48000)
    return [block for chunk in chunks(stream) for block in encoder.encode(chunk)] + encoder.finish()


@pytest.mark.asyncio
async def test_pooled_encoders_run_off_the_loop_and_keep_each_streams_order() -> None:
    pool = EncoderPool(2)
    loop_thread = threading.get_ident()
    threads: set[int] = set()

    async def stream(index: int) -> list[bytes]:
        encoder = make_encoder("opus", 48000)
        encode = encoder.encode

        def spy(chunk: np.ndarray) -> list[bytes]:
            threads.add(threading.get_ident())
            return encode(chunk)

        encoder.encode = spy  # type: ignore[method-assign]
        out: list[bytes] = []
        for chunk in chunks(index):
            out += await pool.encode(encoder, chunk)
            await asyncio.sleep(0)  # let the other streams' calls interleave
        return out + await pool.finish(encoder)

    try:
        results = await asyncio.gather(*(stream(i) for i in range(8)))
    finally:
        pool.close()
    assert loop_thread not in threads and threads
    assert results == [alone(i) for i in range(8)]
