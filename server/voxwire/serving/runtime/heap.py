"""Full garbage collections that cost what the live streams hold, not what the process imported.

CPython's cyclic collector walks every tracked container of the generations it collects, and a full
(generation 2) collection walks them all. A serving process keeps, for its whole life, the hundreds of
thousands of containers its startup made: torch and the model, aiohttp and the app, the tokenizer. Measured
on `voxwire serve --model sim --workers 2` under 200 streams, full collections in a frontend paused its event
loop for 50-180 ms, and every stream waiting on that loop (a first chunk, a ``done``) waited as long.

So once a process is warmed up, ``freeze_startup_heap`` collects once and moves what is left into the
permanent generation, which no collection walks. Objects made later are collected as before; the frozen
ones are still freed by reference counting when their last reference goes, only a reference cycle among
them would outlive its use, and startup objects live as long as the process anyway.
"""

from __future__ import annotations

import gc
import logging

logger = logging.getLogger(__name__)


def freeze_startup_heap(process: str) -> int:
    """Collect, then exempt every surviving object from later collections; returns how many were frozen.

    Call it once the process is warmed up (``process`` names it in the log line)."""
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    logger.info("%s: %d startup objects frozen out of garbage collection", process, frozen)
    return frozen
