"""Start-up phases, as the log and ``/ready`` name them, told by the code that runs each one.

Loading a checkpoint, sizing the KV pool, capturing CUDA graphs and fitting the step cost can each take from a
second to a minute: each says when it begins (``enter``, one INFO line) and a long one says how far it is at least
every ``PROGRESS_INTERVAL_S`` (``Progress``); inside ``reporting`` a watcher thread fills any silence longer than
that (one step that takes longer), so an operator never watches a silent log and wonders whether the server hangs.
Whoever waits for the start-up (``serving.boot``: the listener that answers ``/ready`` meanwhile) hears of each phase
through ``reporting``'s ``on_phase``; the code that runs a phase knows nothing of it (a context variable carries the
reporter, so the thread that runs ``reporting``'s block reports to it).
"""

from __future__ import annotations

import contextlib
import contextvars
import enum
import logging
import threading
import time
from collections.abc import Callable, Iterator

logger = logging.getLogger(__name__)

PROGRESS_INTERVAL_S = 2.0
"""The longest a phase that counts its steps (``Progress``) stays silent in the log."""


class Readiness(enum.Enum):
    """Where the server is, from its start to its end: the ``phase`` of ``/ready``'s answer. The phases before
    ``READY`` come in this order (``SIZING_KV_POOL`` to ``FITTING_STEP_COST`` once per engine)."""

    LOADING_WEIGHTS = "loading_weights"
    SIZING_KV_POOL = "sizing_kv_pool"
    CAPTURING_GRAPHS = "capturing_graphs"
    FITTING_STEP_COST = "fitting_step_cost"
    WARMING_UP = "warming_up"
    READY = "ready"
    DRAINING = "draining"


class Reporter:
    """One start-up's news: the phase it is in (told to ``on_phase``) and when it last logged, so that a watcher
    thread (``reporting``) logs ``still <phase>`` whenever a single long step (a torch import, one slow timed step
    on a busy machine) keeps every other line back for ``interval_s``."""

    def __init__(self, on_phase: Callable[[Readiness], None], interval_s: float) -> None:
        self.on_phase = on_phase
        self.interval_s = interval_s
        self.phase: Readiness | None = None
        self.phase_started = self.last_line = time.monotonic()

    def entered(self, phase: Readiness) -> None:
        self.phase, self.phase_started = phase, time.monotonic()
        self.noted()
        self.on_phase(phase)

    def noted(self) -> None:
        """A start-up line was just logged."""
        self.last_line = time.monotonic()

    def speak_if_silent(self) -> None:
        now = time.monotonic()
        if now - self.last_line >= self.interval_s:
            self.last_line = now
            doing = "starting" if self.phase is None else self.phase.value
            logger.info("start-up: still %s (%.0f s in it)", doing, now - self.phase_started)


_reporter: contextvars.ContextVar[Reporter | None] = contextvars.ContextVar("voxwire_startup_reporter", default=None)


@contextlib.contextmanager
def reporting(
    on_phase: Callable[[Readiness], None] = lambda phase: None, interval_s: float = PROGRESS_INTERVAL_S
) -> Iterator[Reporter]:
    """Within the block (in this thread, and in threads started with its context), every ``enter`` also calls
    ``on_phase``, and the log never stays silent for ``interval_s``: a watcher thread says what is still running."""
    reporter = Reporter(on_phase, interval_s)
    token = _reporter.set(reporter)
    done = threading.Event()

    def watch() -> None:
        while not done.wait(interval_s / 4):
            reporter.speak_if_silent()

    watcher = threading.Thread(target=watch, name="voxwire-startup-log", daemon=True)
    watcher.start()
    try:
        yield reporter
    finally:
        done.set()
        _reporter.reset(token)


def enter(phase: Readiness, message: str, *args: object) -> None:
    """Log that ``phase`` begins (``message % args`` says with what) and tell the start-up's reporter, if any."""
    logger.info("start-up: %s: " + message, phase.value, *args)
    reporter = _reporter.get()
    if reporter is not None:
        reporter.entered(phase)


class Progress:
    """Counts the ``total`` steps of a long phase and logs ``what n/N (elapsed)`` at most every ``interval_s``
    seconds, and once at the end."""

    def __init__(
        self,
        what: str,
        total: int,
        interval_s: float = PROGRESS_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.what = what
        self.total = total
        self.done = 0
        self._interval_s = interval_s
        self._clock = clock
        self._started = self._logged = clock()
        self._reporter = _reporter.get()

    def advance(self, steps: int = 1) -> None:
        """``steps`` more are done: log when the last line is ``interval_s`` old, or when all are done."""
        self.done += steps
        now = self._clock()
        if self.done >= self.total or now - self._logged >= self._interval_s:
            self._logged = now
            logger.info("start-up: %s %d/%d (%.1f s)", self.what, self.done, self.total, now - self._started)
            if self._reporter is not None:
                self._reporter.noted()
