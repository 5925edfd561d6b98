"""The one-process server's start: the port answers from the first second, while the model loads.

Loading a checkpoint, sizing the KV pool, capturing graphs and fitting the step cost take from seconds to minutes.
So that a client or an orchestrator never meets a refused connection meanwhile (it reads as a dead server), the
port is bound first and a starting app answers on it: ``/health`` 200, ``/ready`` 503 naming the phase
(``{"status": "starting", "phase": "loading_weights", "error": {...}}``, the phases of ``startup.Readiness``), every
other route 503 ``not_ready`` with ``Retry-After``, as the full app answers while it warms up. The model loads in a
thread meanwhile (``make_app``, each phase reported through ``startup.reporting``, which also keeps the log from
going silent); then the full app takes over
the same listening sockets (``run_app``'s ``sockets``) and the starting app closes: no connection is refused across
the switch. A failure to load closes the port and raises the error ``make_app`` raises (the command exits with it);
SIGTERM or SIGINT while loading closes the port and exits 0 without waiting for the load.

This module imports no more than aiohttp and the error envelope, so the port answers within about a second of the
command's start; the model's code (torch) and the full app are imported in the loading thread.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import ssl
import threading
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

from aiohttp import web

from voxwire.protocol.error_codes import ErrorCode
from voxwire.serving.edge.error_envelope import RETRY_AFTER_S, ApiError, not_ready_answer
from voxwire.serving.edge.request_id import request_id
from voxwire.startup import Readiness, reporting

logger = logging.getLogger(__name__)
T = TypeVar("T")

REPLICA_HEADER = "X-Voxwire-Replica"
"""Every response (errors and the WebSocket 101 too) names the replica that answered, for behind a balancer."""
_BACKLOG = 1024
"""Connections the kernel queues on the listening socket before the server accepts them."""


def bind(host: str, port: int, *, reuse_port: bool = False) -> list[socket.socket]:
    """Listening sockets on every address ``host`` names (as aiohttp's own site binds them), all on one port (port 0:
    the first socket's free one)."""
    sockets: list[socket.socket] = []
    addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    try:
        for family, kind, proto, _, address in dict.fromkeys(addresses):  # one socket per distinct address
            chosen = sockets[0].getsockname()[1] if sockets else port
            listener = socket.socket(family, kind, proto)
            sockets.append(listener)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if reuse_port:
                listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            if family == socket.AF_INET6:
                listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            listener.bind((address[0], chosen, *address[2:]))
            listener.listen(_BACKLOG)
            listener.setblocking(False)
    except OSError:
        for made in sockets:
            made.close()
        raise
    return sockets


def urls(sockets: Sequence[socket.socket], tls: bool) -> list[str]:
    """``http(s)://host:port`` of each listening socket."""
    scheme = "https" if tls else "http"
    found = []
    for listener in sockets:
        host, port = listener.getsockname()[:2]
        found.append(f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}")
    return found


class Starting:
    """The phase of a start-up still under way, set by the loading thread, read by the starting app."""

    def __init__(self) -> None:
        self.phase = Readiness.LOADING_WEIGHTS

    def enter(self, phase: Readiness) -> None:
        self.phase = phase


def starting_app(phase_of: Callable[[], Readiness], replica_id: str) -> web.Application:
    """The app on the port while the model loads: ``/health`` 200, ``/ready`` 503 with the phase, the rest 503
    ``not_ready`` with ``Retry-After``. Each answer closes its connection, so no client keeps one to this app
    past the switch to the full one."""

    async def answer(request: web.Request) -> web.Response:
        if request.path == "/health":
            response = web.json_response({"status": "ok"})
        else:
            refused = ApiError(
                ErrorCode.NOT_READY,
                f"the server is starting ({phase_of().value}), retry shortly",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )
            made = request_id(request)
            if request.path == "/ready":
                response = not_ready_answer(refused, phase_of(), made)
            else:
                response = refused.response(made)
        response.headers[REPLICA_HEADER] = replica_id
        response.force_close()
        return response

    app = web.Application()
    app.router.add_route("*", "/{path:.*}", answer)
    return app


class StartingListener:
    """The starting app on listening sockets (copies of them: the sockets stay open when this closes)."""

    def __init__(
        self,
        sockets: Sequence[socket.socket],
        replica_id: str,
        tls: ssl.SSLContext | None,
        phase_of: Callable[[], Readiness],
    ) -> None:
        self._sockets = sockets
        self._tls = tls
        self._runner = web.AppRunner(starting_app(phase_of, replica_id), handle_signals=False, access_log=None)

    async def start(self) -> None:
        await self._runner.setup()
        for listener in self._sockets:
            await web.SockSite(self._runner, listener.dup(), ssl_context=self._tls).start()

    async def close(self) -> None:
        await self._runner.cleanup()


_SERVED_POLL_S = 0.01
"""How often a ``StartingThread`` asks whether the port is served by others now (so it leaves within ms)."""


class StartingThread:
    """A ``StartingListener`` on an event loop of its own, in a daemon thread: for a process that has no event loop
    (``workers.supervisor``), until ``served()`` (others serve the port now) or ``stop``."""

    def __init__(self, listener: StartingListener, served: Callable[[], bool]) -> None:
        self._listener = listener
        self._served = served
        self._started = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve()), name="voxwire-starting", daemon=True)

    def start(self) -> None:
        """Start the thread and wait until the listener answers."""
        self._thread.start()
        self._started.wait()

    def stop(self) -> None:
        """Close the listener and end the thread (later calls do nothing)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    async def _serve(self) -> None:
        try:
            await self._listener.start()
        finally:
            self._started.set()
        while not (self._stop.is_set() or self._served()):
            await asyncio.sleep(_SERVED_POLL_S)
        await self._listener.close()


async def load_while_listening(build: Callable[[], T], starting: Starting, stop: asyncio.Event) -> T | None:
    """``build()`` in a thread, its phases told to ``starting``; None if ``stop`` is set first (the thread is left to
    end with the process). Raises what ``build`` raises."""
    loop = asyncio.get_running_loop()
    built: asyncio.Future[T] = loop.create_future()

    def run() -> None:
        try:
            with reporting(starting.enter):
                result = build()
        except BaseException as exc:  # handed to the loop, which raises it in the caller
            loop.call_soon_threadsafe(_fail, built, exc)
        else:
            loop.call_soon_threadsafe(_succeed, built, result)

    # A daemon: SIGTERM during a minute-long load exits at once rather than after it.
    threading.Thread(target=run, name="voxwire-load", daemon=True).start()
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait((built, stopped), return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    if built.done():
        return built.result()
    built.cancel()
    return None


def _succeed(future: asyncio.Future[T], result: T) -> None:
    if not future.done():
        future.set_result(result)


def _fail(future: asyncio.Future[T], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)


def stop_on_signals(stop: asyncio.Event) -> None:
    """SIGTERM and SIGINT set ``stop``."""
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)


def run_loop(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` on uvloop (asyncio's own loop where uvloop has no build, e.g. Windows)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)
