"""Liveness and load shared with the supervisor: how it tells a hung child process from a busy one, and how the
frontends see each other's connections.

A process that is stopped (SIGSTOP, a debugger, a stuck system call) or whose loop is stuck keeps its sockets:
the kernel still hands a hung frontend new connections, and frontends wait on a hung engine. So each child's loop
stamps a heartbeat into memory shared with the supervisor (``Pulse.beat``, a few times a second), and the
supervisor ends a child whose stamp is older than ``liveness_timeout_s`` (``Pulses.silent``). The existing exit
paths then run: a frontend is restarted, a dead engine is restarted or ends the service (``supervisor``). A child
is watched only once it has beaten: loading a model or warming up before its loop starts is not silence.

With ``--devices`` the supervisor also counts each engine's deaths here (``EngineDeaths``): an engine that dies
while another serves is restarted, and each frontend, told (SIGUSR2) or at its next beat, compares the counts
with those of its links to find which engine's streams to end and to which successor to reconnect. A count, not
a flag, so no death goes unseen between two reads.

A frontend's beat also publishes how many WebSocket connections it holds (``Pulse.beat(connections)``), so
each frontend can bound the server's connections, not only its own (``Pulse.others``: the other slots' sum, at
most one beat old). A dead child's slot is cleared when its successor starts, so its connections never leak.
"""

from __future__ import annotations

import multiprocessing.context
import time
from ctypes import c_double, c_int64
from dataclasses import dataclass
from typing import Any

NOT_STARTED = 0.0
"""The stamp of a child whose loop has not beaten yet."""


@dataclass(frozen=True)
class Pulse:
    """One child's heartbeat slot (picklable when the child is started: it carries the shared array)."""

    stamps: Any
    """The shared array of ``time.monotonic()`` stamps (``multiprocessing.RawArray`` of doubles)."""
    connections: Any
    """The shared array of connection counts, one per child (``multiprocessing.RawArray`` of int64)."""
    index: int

    def beat(self, connections: int = 0) -> None:
        self.connections[self.index] = connections
        self.stamps[self.index] = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process on the host

    def others(self) -> int:
        """Connections the other children held at their latest beats."""
        return sum(self.connections) - self.connections[self.index]


class Pulses:
    """The supervisor's side: one slot per child, read without locks (a torn read is impossible for an aligned
    double on the platforms served, and one stale read only delays the verdict by one watch period)."""

    def __init__(self, context: multiprocessing.context.SpawnContext, children: int) -> None:
        self.stamps = context.RawArray(c_double, children)
        self.connections = context.RawArray(c_int64, children)

    def pulse(self, index: int) -> Pulse:
        """Slot ``index``, cleared: a restarted child is watched again only once it beats, and holds no
        connection until it says so."""
        self.stamps[index] = NOT_STARTED
        self.connections[index] = 0
        return Pulse(self.stamps, self.connections, index)

    def started(self, index: int) -> bool:
        """Whether slot ``index``'s child has beaten since it was (re)started: its loop runs."""
        return bool(self.stamps[index] != NOT_STARTED)

    def silent(self, index: int, timeout_s: float) -> float | None:
        """Seconds slot ``index`` has been silent, when over ``timeout_s``; None while alive or not started."""
        stamp = self.stamps[index]
        silence = time.monotonic() - stamp
        return silence if stamp != NOT_STARTED and silence > timeout_s else None


@dataclass(frozen=True)
class EngineDeaths:
    """How many times each engine process has died and been replaced (picklable when a child is started)."""

    counts: Any
    """The shared array of counts, one per engine (``multiprocessing.RawArray`` of int64); only the supervisor
    writes it."""

    @classmethod
    def create(cls, context: multiprocessing.context.SpawnContext, engines: int) -> EngineDeaths:
        return cls(context.RawArray(c_int64, engines))

    def died(self, index: int) -> None:
        """Engine ``index`` died: its next process is its successor (the supervisor's call)."""
        self.counts[index] += 1

    def read(self) -> tuple[int, ...]:
        """Each engine's count now."""
        return tuple(self.counts)
