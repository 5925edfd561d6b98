"""``Metrics``: the server's Prometheus instruments, in a registry of their own (one per app).

Handlers record events (time to first audio, audio produced, errors by code, dropped sessions,
finished utterances); the engine's load (running and queued requests, step time) and the number of
open WebSockets are read at scrape time from callables, so the engine thread never calls into
Prometheus. ``GET /metrics`` serves ``exposition()``.

With ``--workers`` every frontend process records into prometheus_client's multiprocess folder
(``PROMETHEUS_MULTIPROC_DIR``, set by the supervisor before the frontends start), and any frontend's
``/metrics`` sums them all: one view of the service. There the open WebSockets are a ``livesum`` gauge
that each frontend keeps current (``refresh``), and the engines' load comes from the engines' own reports.
The engine gauges, step times and graph captures carry an ``engine`` label (``engine="0"``; one per
``--devices`` entry): ``sum without (engine)`` gives the server's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, SummaryMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from voxwire.engine import EngineStats

_CONNECTIONS = "voxwire_websocket_connections"
_CONNECTIONS_HELP = "Open WebSocket connections."
_LATENCY_BUCKETS = (0.025, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)


class Metrics:
    """Counters and histograms of one app; every method is cheap and safe on the event loop."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(
        self,
        engine_stats: Callable[[], Sequence[EngineStats]],
        connections: Callable[[], int],
        *,
        multiprocess_dir: str | None = None,
    ) -> None:
        self.registry = CollectorRegistry()
        self._connections = connections
        self._connections_gauge: Gauge | None = None
        if multiprocess_dir is None:
            self.registry.register(_LoadCollector(engine_stats, connections))
            self._exposed = self.registry
        else:
            self._exposed = CollectorRegistry()
            MultiProcessCollector(self._exposed, path=multiprocess_dir)
            self._exposed.register(_LoadCollector(engine_stats, None))
            self._connections_gauge = Gauge(
                _CONNECTIONS, _CONNECTIONS_HELP, multiprocess_mode="livesum", registry=self.registry
            )
        self._time_to_first_audio = Histogram(
            "voxwire_time_to_first_audio_seconds",
            "From a request (HTTP) or an utterance's first text (WebSocket) to its first audio chunk.",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self._audio_seconds = Counter("voxwire_audio_seconds", "Seconds of audio produced.", registry=self.registry)
        self._errors = Counter(
            "voxwire_errors", "Errors returned to clients, by error code.", ["code"], registry=self.registry
        )
        self._dropped_sessions = Counter(
            "voxwire_dropped_sessions",
            "Sessions ended by the server or a vanished client before they finished, by reason.",
            ["reason"],
            registry=self.registry,
        )
        self._utterances = Counter(
            "voxwire_utterances", "Utterances finished, by finish reason.", ["finish_reason"], registry=self.registry
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

    def refresh(self) -> None:
        """Publish this process's open connections to the other frontends (multiprocess mode only)."""
        if self._connections_gauge is not None:
            self._connections_gauge.set(self._connections())

    def exposition(self) -> bytes:
        """Every instrument (of every frontend, in multiprocess mode) in Prometheus' text format."""
        self.refresh()
        return generate_latest(self._exposed)


class _LoadCollector(Collector):
    """Gauges read when scraped: engine load and step time, open WebSocket connections."""

    def __init__(
        self, engine_stats: Callable[[], Sequence[EngineStats]], connections: Callable[[], int] | None
    ) -> None:
        """``connections`` None: the gauge comes from the multiprocess files instead."""
        self._engine_stats = engine_stats
        self._connections = connections

    def collect(self) -> Iterator[Metric]:
        every = self._engine_stats()
        yield self._gauge(
            "voxwire_sessions_active",
            "Utterances being synthesized (holding an engine slot).",
            [s.running for s in every],
        )
        yield self._gauge(
            "voxwire_sessions_queued", "Utterances waiting for an engine slot.", [s.waiting for s in every]
        )
        if self._connections is not None:
            yield GaugeMetricFamily(_CONNECTIONS, _CONNECTIONS_HELP, self._connections())
        used = [s.kv_blocks_used for s in every]
        yield self._gauge("voxwire_kv_blocks_used", "KV cache blocks held by running utterances.", used)
        yield self._gauge("voxwire_kv_blocks_total", "KV cache blocks in the pool.", [s.kv_blocks_total for s in every])
        captures = CounterMetricFamily(
            "voxwire_graph_captures",
            "CUDA graphs captured; all are captured before /ready, so this does not move while serving.",
            labels=["engine"],
        )
        capture_time = GaugeMetricFamily(
            "voxwire_graph_capture_seconds",
            "Wall time spent capturing those CUDA graphs (warm-up runs included; before /ready).",
            labels=["engine"],
        )
        steps = SummaryMetricFamily(
            "voxwire_engine_step_seconds",
            "Wall time of engine steps (one batched decode of every running session).",
            labels=["engine"],
        )
        for index, stats in enumerate(every):
            captures.add_metric([str(index)], stats.graph_captures)
            capture_time.add_metric([str(index)], stats.graph_capture_seconds)
            steps.add_metric([str(index)], count_value=stats.steps, sum_value=stats.step_seconds)
        yield captures
        yield capture_time
        yield steps

    @staticmethod
    def _gauge(name: str, documentation: str, values: list[int]) -> GaugeMetricFamily:
        """A gauge with one sample per engine (label ``engine``: its index, ``--devices`` order)."""
        gauge = GaugeMetricFamily(name, documentation, labels=["engine"])
        for index, value in enumerate(values):
            gauge.add_metric([str(index)], value)
        return gauge
