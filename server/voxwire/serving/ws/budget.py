"""``MessageBudget``: a per-connection token bucket that keeps one client from monopolising the event loop.

Every client message costs one token; tokens refill at ``rate`` per second up to ``rate`` (one
second's worth of burst). A connection that spends faster than that for longer than its burst is
closed (``rate_limited``): a flood is cut off after at most one second's worth of messages, however
fast it arrives, so other sessions keep their share of the loop. Sans I/O: the caller passes the time.
"""

from __future__ import annotations

from dataclasses import InitVar, dataclass, field


@dataclass
class MessageBudget:
    rate: float
    """Messages per second a connection may sustain (also the burst)."""
    now: InitVar[float]
    """When the connection opened (seconds, any monotonic clock): it starts with a full bucket."""
    _tokens: float = field(init=False)
    _last: float = field(init=False)

    def __post_init__(self, now: float) -> None:
        self._tokens = self.rate
        self._last = now

    def spend(self, now: float) -> bool:
        """Take one message's token at ``now``; False when the connection is over its budget."""
        self._tokens = min(self.rate, self._tokens + (now - self._last) * self.rate)
        self._last = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True
