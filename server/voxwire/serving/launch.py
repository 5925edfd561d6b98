"""``serve``: the one place that picks the server's topology.

One process (the default on a machine without spare cores): the aiohttp app over an engine thread
(``serving.app``), its port answering from the first second while the model loads (``serving.boot``).
``--workers N`` or ``--devices``: a supervisor starts the engine processes and the frontend processes
(``serving.workers``), each frontend running the same app over an ``EngineProxy``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from typing import TYPE_CHECKING

from aiohttp import web

from voxwire.serving.boot import Starting, StartingListener, bind, load_while_listening, run_loop, urls
from voxwire.serving.edge.tls import server_certificate

if TYPE_CHECKING:
    from voxwire.serving.server_config import ServerConfig

logger = logging.getLogger(__name__)


def serve(config: ServerConfig) -> int:
    """Serve until SIGTERM or SIGINT, draining before the listener closes; the exit status.

    Raises:
        InvalidInputError: the TLS files cannot be read or do not make a pair.
        VoxwireError: the model cannot be loaded (as ``make_app``).
        VoiceAliasError: a ``--voice-alias`` names no voice here.
    """
    from voxwire.serving.speech.voice_store import check_alias_targets  # numpy, safetensors: not torch

    check_alias_targets(config.voices.voice_aliases, config.voices.voices_dir)  # before the port or the model
    if config.topology.frontends > 0:
        from voxwire.serving.workers.supervisor import supervise

        return supervise(config)
    status = run_loop(_serve_one_process(config))
    if status is None:
        # Stopped while the model loads: the loading thread cannot be interrupted, and an interpreter that exits
        # around it aborts (torch's threads); nothing is left to clean up, so the process ends here.
        logging.shutdown()
        os._exit(0)
    return status


async def _serve_one_process(config: ServerConfig) -> int | None:
    """Bind, answer as a starting server while the model loads, then serve it on the same sockets; the exit status,
    None when stopped before the model was loaded."""
    transport = config.transport
    certificate = server_certificate(transport.tls_cert, transport.tls_key)
    sockets = bind(transport.host, transport.port)
    starting = Starting()
    tls = None if certificate is None else certificate.context
    listener = StartingListener(sockets, transport.replica_id, tls, lambda: starting.phase)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    watch = None
    if certificate is not None:
        loop.add_signal_handler(signal.SIGHUP, certificate.reload, "SIGHUP")
        watch = asyncio.create_task(certificate.watch(transport.tls_poll_s), name="voxwire-tls-watch")

    async def close() -> None:
        await listener.close()
        for bound in sockets:
            bound.close()

    try:
        await listener.start()
        for url in urls(sockets, tls=certificate is not None):
            logger.info("listening on %s (starting: /ready answers 503 until the model is loaded and warm)", url)
        app = await load_while_listening(lambda: _make_app(config), starting, stop)
    except BaseException:  # the model cannot load (its error stops the command), or the loop ends
        await close()
        raise
    finally:
        if watch is not None:
            watch.cancel()
    if app is None:
        logger.info("stopped while starting")
        await close()
        return None
    from voxwire.serving.app import Listening, run_app
    from voxwire.serving.runtime.keys import STATE_KEY

    for signum in (signal.SIGTERM, signal.SIGINT):  # from here the app's own stop drains it
        loop.add_signal_handler(signum, app[STATE_KEY].stop.set)
    return await run_app(app, config, listening=Listening(sockets, certificate, listener.close))


def _make_app(config: ServerConfig) -> web.Application:
    """The full app (``make_app``), imported here: the loading thread pays for importing the server's and the
    model's code, while the port already answers."""
    from voxwire.serving.app import make_app

    return make_app(config)
