"""A frontend process of ``voxwire serve --workers N``: the one-process server's app over an ``EngineProxy``.

It shares the port with the other frontends (``SO_REUSEPORT``), speaks to the engine processes over ZeroMQ,
and exits 1 once told (SIGUSR1) that an engine died, so that the supervisor's exit path runs.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal

from voxwire.serving.app import build_app, run_app, run_loop
from voxwire.serving.config import ServerConfig
from voxwire.serving.keys import METRICS_KEY, STATE_KEY, Phase
from voxwire.serving.workers.proxy import EngineProxy, SharedVoiceStore

logger = logging.getLogger(__name__)


def run_frontend(
    config: ServerConfig, index: int, endpoints: tuple[str, ...], metrics_dir: str, log_level: str
) -> None:
    """A frontend process's main: the app over an ``EngineProxy``, on the shared port; exits 1 if the engine died."""
    logging.basicConfig(level=log_level, format=f"%(asctime)s %(levelname)s %(name)s[frontend-{index}]: %(message)s")
    raise SystemExit(run_loop(_frontend(config, index, endpoints, metrics_dir)))


async def _frontend(config: ServerConfig, index: int, endpoints: tuple[str, ...], metrics_dir: str) -> int:
    parent = os.getppid()
    # Waits for every engine's welcome (each may still be loading its model): /ready is 200 only once all are.
    proxy = await EngineProxy.connect(endpoints, index, config)
    voices = SharedVoiceStore(proxy, config.voices_dir, config.max_voices)
    app = build_app(config, proxy, voices, metrics_dir=metrics_dir)
    stop = asyncio.Event()
    engine_dead = False

    def on_engine_death() -> None:
        nonlocal engine_dead
        engine_dead = True
        app[STATE_KEY].phase = Phase.DRAINING  # /ready answers 503 from now on
        proxy.engine_died()
        stop.set()

    async def watch() -> None:
        """Keep this frontend's share of the metrics current; stop if the supervisor is gone."""
        while os.getppid() == parent:
            app[METRICS_KEY].refresh()
            await asyncio.sleep(1.0)
        logger.error("the supervisor is gone: stopping")
        stop.set()

    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, on_engine_death)
    watcher = asyncio.create_task(watch(), name="voxwire-frontend-watch")
    try:
        await run_app(app, config, reuse_port=True, stop=stop)
    finally:
        watcher.cancel()
    return 1 if engine_dead else 0
