"""Liveness and load shared with the supervisor: how it tells a hung child process from a busy one, and how the
frontends see each other's connections.

A process that is stopped (SIGSTOP, a debugger, a stuck system call) or whose loop is stuck keeps its sockets:
the kernel still hands a hung frontend new connections, and frontends wait on a hung engine. A busy process, on
the other hand (a long batched prefill, a CPU shared with several times as many runnable processes as it has
cores, a sibling engine loading its model), must never be taken for a hung one. So each child is watched by two
separate rules, each stated once here (``Pulses.hang``):

- **Life** (``--liveness-timeout-s``, seconds): a small thread in every child (``Pulse.start_heart``) stamps
  ``alive`` every ``HEART_S``, whatever the child's loop is doing. It needs a few microseconds of CPU a beat, so
  a starved process still beats; only a process that is not scheduled at all (stopped, frozen, swapped out for
  good) falls silent. A stamp older than the timeout: the child is not running.
- **Progress** (``--stall-timeout-s``, tens of seconds, and ``--stall-factor``): the child's loop stamps
  ``progress`` each time round, with what it is doing now (``Activity``) and how long that may take
  (``within_s``: the engine's worst modelled step times the factor, never less than the stall timeout). A
  progress stamp older than its own bound: the loop is stuck (a deadlock, a step that never returns), though
  the process runs. Before its loop's first stamp (loading the model, capturing graphs) only life is watched.

The supervisor ends a child that breaks either rule and logs which rule, for how long and what the child was
doing (``Hang.describe``); the existing exit paths then run: a frontend is restarted, an engine is replaced
(``supervisor``).

The supervisor also counts each engine's deaths here (``EngineDeaths``): each frontend, told (SIGUSR2) or at its
next beat, compares the counts with those of its links to find which engine's streams to end and to which
successor to reconnect. A count, not a flag, so no death goes unseen between two reads.

Each frontend publishes how many WebSocket connections it holds here, so that it can bound the server's
connections, not only its own (``Pulse`` is a frontend's ``keys.Seats``): it checks the others' sum, adds a
connection and publishes its new count under one lock shared by the frontends, so a burst of upgrades spread
over them cannot pass the bound. A dead child's slot is cleared when its successor starts, so its connections
never leak.
"""

from __future__ import annotations

import contextlib
import enum
import multiprocessing.context
import multiprocessing.synchronize
import threading
import time
from collections.abc import Iterator
from ctypes import Array, c_double, c_int64
from dataclasses import dataclass

from voxwire.startup import Readiness

NOT_STARTED = 0.0
"""The stamp of a child whose heart (``alive``) or loop (``progress``) has not beaten yet."""
HEART_S = 0.25
"""How often a child's heart thread stamps ``alive``."""


class Activity(enum.IntEnum):
    """What a child's loop was doing at its latest progress stamp (for the log line that ends a hung child)."""

    WAITING = 1
    """Waiting for a message, a connection or a due step."""
    STEPPING = 2
    """Running one engine step (a batched decode, perhaps with admissions)."""
    DRAINING = 3
    """Aborting its requests and stepping until none is left (stopping)."""
    SERVING = 4
    """A frontend's event loop turning (connections, encoders)."""

    def describe(self) -> str:
        return {
            Activity.WAITING: "waiting for work",
            Activity.STEPPING: "running an engine step",
            Activity.DRAINING: "draining its requests",
            Activity.SERVING: "serving connections",
        }[self]


class HangRule(enum.Enum):
    """Which of the two rules a hung child broke."""

    NO_LIFE = "no life"
    """Its heart thread did not beat for ``--liveness-timeout-s``: the process is not running."""
    NO_PROGRESS = "no progress"
    """Its loop did not come round within its own bound: the process runs, its loop is stuck."""


@dataclass(frozen=True)
class Hang:
    """The verdict on a hung child: which rule, how long, against which bound, doing what."""

    rule: HangRule
    silent_s: float
    bound_s: float
    activity: Activity
    requests: int
    """Requests the engine held (running or waiting) at its latest progress stamp (0 for a frontend)."""

    def describe(self) -> str:
        doing = self.activity.describe() + (f" with {self.requests} request(s) in the engine" if self.requests else "")
        if self.rule is HangRule.NO_LIFE:
            return (
                f"showed no life for {self.silent_s:.1f} s (--liveness-timeout-s {self.bound_s:g}: the process is "
                f"not running, e.g. stopped or frozen); it was last {doing}"
            )
        return (
            f"made no progress for {self.silent_s:.1f} s (its bound {self.bound_s:.1f} s, from --stall-timeout-s "
            f"and --stall-factor): stuck while {doing}"
        )


@dataclass(frozen=True)
class _Slots:
    """The shared arrays, one entry per child (``multiprocessing.RawArray``s; picklable when a child starts)."""

    alive: Array[c_double]
    """``time.monotonic()`` of each child's latest heart beat (doubles)."""
    progress: Array[c_double]
    """``time.monotonic()`` of each child's latest loop progress (doubles)."""
    within: Array[c_double]
    """Seconds each child's loop may take before its next progress stamp (doubles)."""
    activity: Array[c_int64]
    """Each child's ``Activity`` at its latest progress stamp (int64)."""
    requests: Array[c_int64]
    """Each engine's requests (running or waiting) at its latest progress stamp (int64)."""
    connections: Array[c_int64]
    """Each frontend's WebSocket connections, as it last published them (int64; ``Pulse.publish``)."""
    phase: Array[c_int64]
    """Each child's start-up phase, as its position in ``startup.Readiness`` (int64; ``Pulse.entered``): what the
    supervisor's starting listener names while no frontend serves the port yet."""


_PHASES = list(Readiness)

SEAT_LOCK_TIMEOUT_S = 0.5
"""Longest wait for the frontends' connection lock (``Pulse.taking``): held for microseconds, it can only stay
taken by a frontend killed inside it, and then the check goes on unlocked rather than refuse every connection."""


@dataclass(frozen=True)
class Pulse:
    """One child's slot: its heart, its loop's progress, its connections (a frontend's ``keys.Seats``)."""

    slots: _Slots
    index: int
    seat_lock: multiprocessing.synchronize.Lock
    """The frontends' lock around checking and taking a connection seat (``multiprocessing.Lock``)."""

    def start_heart(self) -> threading.Thread:
        """Start the daemon thread that stamps ``alive`` every ``HEART_S`` for as long as the process runs.

        Call it first thing in the child, before loading anything: from its first beat the child is watched for
        life (a stopped process is caught while it loads its model, too)."""
        alive, index = self.slots.alive, self.index

        def beat() -> None:
            while True:
                alive[index] = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process on the host
                time.sleep(HEART_S)

        heart = threading.Thread(target=beat, name="voxwire-heart", daemon=True)
        heart.start()
        return heart

    def progressed(self, activity: Activity, within_s: float, *, requests: int = 0) -> None:
        """The loop came round: it is now ``activity``, and comes round again within ``within_s`` unless stuck."""
        slots, index = self.slots, self.index
        slots.requests[index] = requests
        slots.activity[index] = activity
        slots.within[index] = within_s
        slots.progress[index] = time.monotonic()  # last: a reader that sees it sees the bound it goes with

    def others(self) -> int:
        """Connections the other children hold (as each last published them)."""
        return int(sum(self.slots.connections) - self.slots.connections[self.index])

    @contextlib.contextmanager
    def taking(self) -> Iterator[None]:
        """Hold the frontends' seat lock (``keys.Seats.taking``)."""
        acquired = self.seat_lock.acquire(timeout=SEAT_LOCK_TIMEOUT_S)
        try:
            yield
        finally:
            if acquired:
                self.seat_lock.release()

    def entered(self, phase: Readiness) -> None:
        """This child's start-up is now in ``phase`` (``READY``: a frontend listens on the port)."""
        self.slots.phase[self.index] = _PHASES.index(phase)

    def joined(self) -> None:
        """This frontend listens on the port now: the supervisor's starting listener may leave it."""
        self.entered(Readiness.READY)

    def publish(self, held: int) -> None:
        """This frontend holds ``held`` connections now."""
        self.slots.connections[self.index] = held


class Pulses:
    """The supervisor's side: one slot per child, read without locks (a torn read is impossible for an aligned
    double on the platforms served, and one stale read only delays the verdict by one watch period)."""

    def __init__(self, context: multiprocessing.context.SpawnContext, children: int) -> None:
        self.slots = _Slots(
            alive=context.RawArray(c_double, children),
            progress=context.RawArray(c_double, children),
            within=context.RawArray(c_double, children),
            activity=context.RawArray(c_int64, children),
            requests=context.RawArray(c_int64, children),
            connections=context.RawArray(c_int64, children),
            phase=context.RawArray(c_int64, children),
        )
        self.seat_lock = context.Lock()

    def pulse(self, index: int) -> Pulse:
        """Slot ``index``, cleared: a restarted child is watched again only once it beats, and holds no
        connection until it says so."""
        slots = self.slots
        slots.alive[index] = NOT_STARTED
        slots.progress[index] = NOT_STARTED
        slots.connections[index] = 0
        slots.requests[index] = 0
        slots.phase[index] = _PHASES.index(Readiness.LOADING_WEIGHTS)
        return Pulse(slots, index, self.seat_lock)

    def phase(self, index: int) -> Readiness:
        """The start-up phase of slot ``index``'s child (``Pulse.entered``)."""
        return _PHASES[self.slots.phase[index]]

    def started(self, index: int) -> bool:
        """Whether slot ``index``'s child's loop has come round since it was (re)started: it serves."""
        return bool(self.slots.progress[index] != NOT_STARTED)

    def hang(self, index: int, liveness_timeout_s: float, watched_since: float) -> Hang | None:
        """The verdict on slot ``index``'s child now (the module docstring's two rules); None while it lives and
        progresses, or has not started to beat.

        ``watched_since``: since when (``time.monotonic()``) the watcher itself has run without a gap. Silence
        counts only from then: a watcher that was not scheduled either (the whole machine paused, or starved
        as much as the child) has seen nothing to judge, and gives every child a full timeout to beat again."""
        slots, now = self.slots, time.monotonic()
        activity = Activity(slots.activity[index]) if slots.activity[index] else Activity.WAITING
        alive = slots.alive[index]
        if alive != NOT_STARTED and now - max(alive, watched_since) > liveness_timeout_s:
            return Hang(HangRule.NO_LIFE, now - alive, liveness_timeout_s, activity, slots.requests[index])
        progress, within = slots.progress[index], slots.within[index]
        if progress != NOT_STARTED and now - max(progress, watched_since) > within:
            return Hang(HangRule.NO_PROGRESS, now - progress, within, activity, slots.requests[index])
        return None


@dataclass(frozen=True)
class EngineDeaths:
    """How many times each engine process has died and been replaced (picklable when a child is started)."""

    counts: Array[c_int64]
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
