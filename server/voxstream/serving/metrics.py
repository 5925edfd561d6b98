"""``Metrics``: the server's Prometheus instruments, in a registry of their own (one per app).

Handlers record events (time to first audio, audio produced, errors by code, dropped sessions,
finished utterances); the engine's load (running and queued requests, step time) and the number of
open WebSockets are read at scrape time from callables, so the engine thread never calls into
Prometheus. ``GET /metrics`` serves ``exposition()``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, SummaryMetricFamily
from prometheus_client.registry import Collector

from voxstream.engine import EngineStats

_LATENCY_BUCKETS = (0.025, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)


class Metrics:
    """Counters and histograms of one app; every method is cheap and safe on the event loop."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, engine_stats: Callable[[], EngineStats], connections: Callable[[], int]) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_LoadCollector(engine_stats, connections))
        self._time_to_first_audio = Histogram(
            "voxstream_time_to_first_audio_seconds",
            "From a request (HTTP) or an utterance's first text (WebSocket) to its first audio chunk.",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self._audio_seconds = Counter("voxstream_audio_seconds", "Seconds of audio produced.", registry=self.registry)
        self._errors = Counter(
            "voxstream_errors", "Errors returned to clients, by error code.", ["code"], registry=self.registry
        )
        self._dropped_sessions = Counter(
            "voxstream_dropped_sessions",
            "Sessions ended by the server or a vanished client before they finished, by reason.",
            ["reason"],
            registry=self.registry,
        )
        self._utterances = Counter(
            "voxstream_utterances", "Utterances finished, by finish reason.", ["finish_reason"], registry=self.registry
        )

    def observe_first_audio(self, seconds: float) -> None:
        self._time_to_first_audio.observe(seconds)

    def add_audio(self, seconds: float) -> None:
        self._audio_seconds.inc(seconds)

    def count_error(self, code: str) -> None:
        self._errors.labels(code=code).inc()

    def count_dropped(self, reason: str) -> None:
        self._dropped_sessions.labels(reason=reason).inc()

    def count_utterance(self, finish_reason: str) -> None:
        self._utterances.labels(finish_reason=finish_reason).inc()

    def exposition(self) -> bytes:
        """The registry in Prometheus' text format."""
        return generate_latest(self.registry)


class _LoadCollector(Collector):
    """Gauges read when scraped: engine load and step time, open WebSocket connections."""

    def __init__(self, engine_stats: Callable[[], EngineStats], connections: Callable[[], int]) -> None:
        self._engine_stats = engine_stats
        self._connections = connections

    def collect(self) -> Iterator[Metric]:
        stats = self._engine_stats()
        yield GaugeMetricFamily(
            "voxstream_sessions_active", "Utterances being synthesized (holding an engine slot).", stats.running
        )
        yield GaugeMetricFamily("voxstream_sessions_queued", "Utterances waiting for an engine slot.", stats.waiting)
        yield GaugeMetricFamily("voxstream_websocket_connections", "Open WebSocket connections.", self._connections())
        yield GaugeMetricFamily(
            "voxstream_kv_blocks_used", "KV cache blocks held by running utterances.", stats.kv_blocks_used
        )
        yield GaugeMetricFamily("voxstream_kv_blocks_total", "KV cache blocks in the pool.", stats.kv_blocks_total)
        yield CounterMetricFamily(
            "voxstream_graph_captures",
            "CUDA graphs captured; all are captured before /ready, so this does not move while serving.",
            stats.graph_captures,
        )
        yield SummaryMetricFamily(
            "voxstream_engine_step_seconds",
            "Wall time of engine steps (one batched decode of every running session).",
            count_value=stats.steps,
            sum_value=stats.step_seconds,
        )
