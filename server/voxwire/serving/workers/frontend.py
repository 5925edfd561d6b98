"""A frontend process of ``voxwire serve --workers N``: the one-process server's app over an ``EngineProxy``.

It shares the port with the other frontends (``SO_REUSEPORT``), speaks to the engine processes over ZeroMQ,
and exits 1 once told (SIGUSR1) that the service ends (an engine that never served, a crash loop), so that the
supervisor's exit path runs. Told (SIGUSR2) that an engine died and is being replaced, or finding it at its next
beat (``EngineDeaths``), it ends that engine's streams only (``engine_restarted``) and reconnects to the
successor (``EngineLinks.lost``); while no engine serves, ``/ready`` answers 503 and new work is refused.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket

from voxwire.serving.app import Listening, build_app, run_app, run_loop, stop_failed
from voxwire.serving.edge.tls import server_certificate
from voxwire.serving.runtime.keys import METRICS_KEY, STATE_KEY
from voxwire.serving.server_config import ServerConfig
from voxwire.serving.workers.liveness import Activity, EngineDeaths, Pulse
from voxwire.serving.workers.proxy import EngineProxy
from voxwire.serving.workers.shared_voices import SharedVoiceStore

_BEAT_S = 0.5
"""How often the event loop stamps its progress (``liveness``)."""
_METRICS_EVERY = 2
"""Heartbeats between refreshes of this frontend's share of the metrics (once a second)."""


def run_frontend(
    config: ServerConfig,
    index: int,
    endpoints: tuple[str, ...],
    metrics_dir: str,
    log_level: str,
    pulse: Pulse,
    deaths: EngineDeaths,
    sockets: tuple[socket.socket, ...],
) -> None:
    """A frontend process's main: the app over an ``EngineProxy``, on the shared port; exits 1 if the service
    ended with an engine's death. ``sockets``: the supervisor's listening sockets, which it answered on while the
    server started, for this frontend to serve once warmed up (none: it binds its own, sharing the port)."""
    logging.basicConfig(level=log_level, format=f"%(asctime)s %(levelname)s %(name)s[frontend-{index}]: %(message)s")
    raise SystemExit(run_loop(_frontend(config, index, endpoints, metrics_dir, pulse, deaths, sockets)))


async def _frontend(
    config: ServerConfig,
    index: int,
    endpoints: tuple[str, ...],
    metrics_dir: str,
    pulse: Pulse,
    deaths: EngineDeaths,
    sockets: tuple[socket.socket, ...],
) -> int:
    parent = os.getppid()
    pulse.start_heart()
    # Waits for every engine's welcome (each may still be loading its model): /ready is 200 only once all are.
    proxy = await EngineProxy.connect(endpoints, index, config, deaths.read())
    voices = SharedVoiceStore(proxy.links, config.voices)
    app = build_app(config, proxy, voices, metrics_dir=metrics_dir)
    app[STATE_KEY].seats = pulse  # --max-connections bounds the server, not this frontend
    stall_timeout_s = config.topology.stall_timeout_s

    def on_service_end(reason: str) -> None:
        """The supervisor ends the service (an engine that never served, a crash loop; SIGUSR1), or is gone."""
        proxy.engine_died()
        stop_failed(app, reason)

    async def watch() -> None:
        """Show the supervisor this loop turns and keep this frontend's share of the metrics current. Without
        the supervisor nothing replaces a dead engine or watches a hung one: that counts as losing the engine
        (streams end with ``unavailable`` now, rather than draining toward an engine nobody minds)."""
        beats = 0
        while os.getppid() == parent:
            proxy.links.lost(deaths.read())  # a death told while this loop was not yet watched (no SIGUSR2 then)
            pulse.progressed(Activity.SERVING, stall_timeout_s)
            if beats % _METRICS_EVERY == 0:
                app[METRICS_KEY].refresh()
            beats += 1
            await asyncio.sleep(_BEAT_S)
        on_service_end("the supervisor is gone: ending the streams and stopping")

    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGUSR1, on_service_end, "the supervisor ended the service (see its log)")
    loop.add_signal_handler(signal.SIGUSR2, lambda: proxy.links.lost(deaths.read()))
    watcher = asyncio.create_task(watch(), name="voxwire-frontend-watch")
    try:
        # The supervisor's sockets, taken over (it stops answering on them once this joined): no connection queued
        # on them is lost at the switch, as it would be if it closed them.
        transport = config.transport
        listening = Listening(sockets, server_certificate(transport.tls_cert, transport.tls_key)) if sockets else None
        return await run_app(app, config, reuse_port=True, listening=listening, joined=pulse.joined)
    finally:
        watcher.cancel()
