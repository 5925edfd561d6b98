"""``AsyncEngine``: runs an ``Engine`` in one dedicated thread and streams its outputs to asyncio.

The event loop never executes a step: ``Engine.step(now)`` runs in a named engine thread, which is
the only thread that touches the ``Engine``. Callers on the loop post commands (add, abort, stop)
that the engine thread applies between steps, and each session receives its outputs through its
own channel, fed with ``loop.call_soon_threadsafe``. The cycle itself (when a step is due, its stats,
the order its outputs are handed over, ``mark_sent``) is ``EngineLoop``'s, as in an engine process.
This module does not encode audio or apply backpressure to slow consumers: a channel buffers every
output it is given (at most one chunk per session per step), so the serving layer must bound the
backlog, e.g. abort a session whose unsent audio exceeds a few seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
from collections import deque
from collections.abc import AsyncGenerator, Callable
from types import TracebackType
from typing import Any

from voxwire.chunk import Chunk
from voxwire.engine.engine import Engine
from voxwire.engine.errors import EngineDeadError, EngineError
from voxwire.engine.loop import EngineLoop, EngineStats
from voxwire.engine.request import Request
from voxwire.engine.streams import OutputStreams

logger = logging.getLogger(__name__)


class AsyncEngine:
    """Asyncio front end of an ``Engine``; one instance serves one event loop.

    Usage::

        async with AsyncEngine(Engine(runner, config)) as engine:
            async for output in engine.stream(request):
                ...  # output.audio, then output.finish_reason on the last one
    """

    def __init__(
        self,
        engine: Engine,
        *,
        thread_name: str = "voxwire-engine",
        death_error: type[EngineDeadError] = EngineDeadError,
    ) -> None:
        """``death_error``: what the open streams raise if the engine thread dies (``EngineRestartingError``
        where the owner replaces a dead engine)."""
        # Only the engine thread touches _engine (and _engine_loop, which steps it) once start() has run.
        self._engine = engine
        self._death_error = death_error
        self.stepping_since: float | None = None
        """When (``time.monotonic()``) the step now running began; None between steps. Written by the engine
        thread (one reference assignment: any thread reads a whole value), read by a watchdog for a stuck step."""
        self.death: BaseException | None = None
        """What ended the engine thread, once it died (set on the event loop)."""
        self._abandoned = False
        self._engine_loop = EngineLoop(engine, self._deliver)
        self._thread = threading.Thread(target=self._run, name=thread_name, daemon=True)
        # _commands and _stopping are shared with the engine thread, guarded by _wakeup.
        self._wakeup = threading.Condition()
        self._commands: deque[Callable[[], object]] = deque()
        self._stopping = False
        # Loop-side state, touched only on the event loop thread.
        self._event_loop: asyncio.AbstractEventLoop | None = None
        self._streams = OutputStreams()

    async def __aenter__(self) -> AsyncEngine:
        self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    def start(self) -> None:
        """Start the engine thread. Call it from the event loop that will consume the streams."""
        if self._event_loop is not None:
            raise RuntimeError("AsyncEngine.start() was already called")
        self._event_loop = asyncio.get_running_loop()
        self._thread.start()

    async def stop(self) -> None:
        """Abort every request, deliver their final outputs, and join the engine thread."""
        if self._event_loop is None or self._abandoned:
            return
        if self._streams.closed_reason is None:
            self._streams.closed_reason = "the engine is stopped"
        with self._wakeup:
            self._stopping = True
            self._wakeup.notify()
        await asyncio.to_thread(self._thread.join)
        # The thread's last dispatches ran before this line (loop callbacks are FIFO); anything
        # still open never got a final output because the thread died on its way out.
        self._streams.close("the engine is stopped")

    async def stream(self, request: Request) -> AsyncGenerator[Chunk, None]:
        """Submit ``request`` and yield its outputs in order; the last one has a finish reason.

        Leaving early (cancellation, ``aclose()``, an exception in the consumer) aborts the request.

        Raises:
            EngineDeadError: the engine is not started, stopped, or its thread died.
            DuplicateRequestError: the id is in use by an unfinished request.
            QueueFullError: the engine's waiting queue is full.
            ValueError: a synthesis parameter is outside the engine's limits.
        """
        channel = self._open(request)
        async for output in self._streams.stream(request.request_id, channel, self.abort):
            yield output

    def abandon(self, reason: str) -> None:
        """Fail every open stream now (``EngineDeadError(reason)``) without waiting for the engine thread, which
        is stuck in a step and may never return; ``stop`` then does not wait for it either."""
        self._streams.close(reason)
        self._abandoned = True

    def stats(self) -> EngineStats:
        """The load after the most recent step; safe to call from any thread."""
        return self._engine_loop.stats

    def abort(self, request_id: str) -> None:
        """Abort a request from the event loop; its stream ends with an ``aborted`` output."""
        if self._streams.closed_reason is None:
            self._submit(lambda: self._engine.abort(request_id))

    def _open(self, request: Request) -> asyncio.Queue[Chunk | BaseException]:
        if self._event_loop is None:
            raise EngineDeadError("the engine is not started")
        if self._streams.closed_reason is None and asyncio.get_running_loop() is not self._event_loop:
            raise RuntimeError("AsyncEngine.stream() must run on the event loop that called start()")
        # A channel stays registered until its final output, so this also refuses the id of an
        # aborted request whose abort the engine thread has not applied yet.
        channel = self._streams.open(request.request_id)
        self._submit(lambda: self._add(request))
        return channel

    def _submit(self, command: Callable[[], object]) -> None:
        with self._wakeup:
            self._commands.append(command)
            self._wakeup.notify()

    # ---- engine thread -------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while self._serve_once():
                pass
        except BaseException as exc:
            logger.exception("engine thread died")
            # The loop may already be closed, and then nobody is left to tell.
            with contextlib.suppress(RuntimeError):
                self._post(self._die, exc)

    def _serve_once(self) -> bool:
        """Apply pending commands, then run one step if one is due; False once stopped (after the drain)."""
        with self._wakeup:
            while not (self._commands or self._stopping):
                wait_s = self._engine_loop.wait_s()
                if wait_s <= 0:
                    break
                self._wakeup.wait(None if wait_s == math.inf else wait_s)
            commands = list(self._commands)
            self._commands.clear()
            stopping = self._stopping
        for command in commands:
            command()
        if stopping:
            self._engine_loop.drain()
            return False
        self.stepping_since = time.monotonic()
        self._engine_loop.run_due()
        self.stepping_since = None
        return True

    def _add(self, request: Request) -> None:
        try:
            self._engine_loop.add(request)
        except (EngineError, ValueError) as exc:
            self._post(self._reject, request.request_id, exc)

    def _deliver(self, outputs: list[Chunk]) -> None:
        self._post(self._dispatch, outputs)

    def _post(self, callback: Callable[..., object], *args: Any) -> None:
        assert self._event_loop is not None
        self._event_loop.call_soon_threadsafe(callback, *args)

    # ---- event loop ----------------------------------------------------------------------

    def _dispatch(self, outputs: list[Chunk]) -> None:
        self._streams.dispatch(outputs)

    def _reject(self, request_id: str, exc: BaseException) -> None:
        self._streams.reject(request_id, exc)

    def _die(self, exc: BaseException) -> None:
        self.death = exc
        self._streams.closed_reason = None  # the death is the reason, even during a stop
        self._streams.close(f"the engine thread died: {type(exc).__name__}: {exc}", exc, self._death_error)
