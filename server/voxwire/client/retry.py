"""Opening a connection again when the server says "not now": exponential backoff with jitter.

A replica that is warming up, draining or full refuses a new connection with HTTP 503 and
``Retry-After`` (a balancer with no replica left answers 502/503/504), or, from an older server, with
``busy``/``unavailable`` and close code 1013: ``Connection.open`` raises ``ServerBusyError`` for all of
them, and ``open_with_retry`` tries again, waiting longer each time, never less than the server asked
(up to ``max_delay_s``), with a random stretch so that clients refused together do not return together.
Other failures (a wrong address, a refused key) are not retried.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from voxwire.client.connection import Connection
from voxwire.client.errors import ServerBusyError

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently a refused connection is tried again."""

    retries: int = 5
    """Attempts after the first; 0 never retries."""
    first_delay_s: float = 0.25
    max_delay_s: float = 8.0
    """No wait is longer, whatever ``Retry-After`` says."""
    jitter: float = 0.5
    """Each wait is stretched by a random factor in [1, 1 + jitter]."""

    def __post_init__(self) -> None:
        if self.retries < 0:
            raise ValueError(f"retries must be >= 0, got {self.retries}")
        if not 0 < self.first_delay_s <= self.max_delay_s:
            raise ValueError("delays must satisfy 0 < first_delay_s <= max_delay_s")
        if self.jitter < 0:
            raise ValueError(f"jitter must be >= 0, got {self.jitter}")

    def delay_s(self, retry: int, retry_after_s: float | None, rng: random.Random | None = None) -> float:
        """The wait before retry number ``retry`` (0-based); ``rng`` draws the jitter (default: ``random``'s)."""
        backoff = self.first_delay_s * 2.0**retry
        floor = 0.0 if retry_after_s is None else retry_after_s
        stretch = (rng or random).uniform(1.0, 1.0 + self.jitter)
        return min(self.max_delay_s, max(backoff, floor)) * stretch


async def open_with_retry(
    server: str,
    token: str | None,
    policy: RetryPolicy,
    *,
    log: Callable[[str], None] | None = None,
) -> Connection:
    """``Connection.open``, retried per ``policy`` while the server refuses for now; raises the last refusal."""
    return await retry_while_busy(lambda: Connection.open(server, token), policy, log=log)


async def retry_while_busy(
    attempt: Callable[[], Awaitable[T]],
    policy: RetryPolicy,
    *,
    log: Callable[[str], None] | None = None,
) -> T:
    """``attempt()`` (opening a connection, sending a request), retried per ``policy`` while it raises
    ``ServerBusyError``; raises the last refusal."""
    retry = 0
    while True:
        try:
            return await attempt()
        except ServerBusyError as exc:
            if retry == policy.retries:
                raise ServerBusyError(f"{exc} (gave up after {retry + 1} attempt(s))", exc.retry_after_s) from None
            delay = policy.delay_s(retry, exc.retry_after_s)
            if log is not None:
                log(f"{exc}; retrying in {delay:.2f} s")
            await asyncio.sleep(delay)
            retry += 1
