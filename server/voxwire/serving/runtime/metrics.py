"""``Metrics``: the server's Prometheus instruments, in a registry of their own (one per app).

Handlers record events (HTTP requests by route template and status, time to first audio, audio produced, errors
by code, dropped sessions, finished utterances); the engine's load (running and waiting requests, KV blocks), its
step times and queue waits (histograms the engine keeps itself, ``LatencyHistogram``), its real-time step budget
(measured step cost, predicted load, budget, streams shed), the open WebSockets and live
utterances, the build and the processes' CPU and memory are read at scrape time from callables, so the engine
thread never calls into Prometheus. ``GET /metrics`` serves ``exposition()``.

With ``--workers`` every frontend process records into prometheus_client's multiprocess folder
(``PROMETHEUS_MULTIPROC_DIR``, set by the supervisor before the frontends start), and any frontend's
``/metrics`` sums them all: one view of the service. There the open WebSockets and live utterances are
``livesum`` gauges that each frontend keeps current (``refresh``), the engines' load comes from the engines' own
reports, and the process metrics are read from ``/proc`` for every process the supervisor lists in the folder's
``processes/`` (``register_process``). The engine's metrics carry an ``engine`` label (``engine="0"``; one per
``--devices`` entry): ``sum without (engine)`` gives the server's; the process metrics a ``process`` label.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from voxwire.engine import LATENCY_BUCKETS_S, EngineStats, LatencyHistogram, Priority

# No ``_created`` series beside each counter and histogram: the multiprocess mode of --workers has none, and both
# modes expose the same metrics (the ones docs/operations.md lists).
disable_created_metrics()

_CONNECTIONS = "voxwire_websocket_connections"
_CONNECTIONS_HELP = "Open WebSocket connections."
_UTTERANCES_LIVE = "voxwire_utterances_in_progress"
_UTTERANCES_LIVE_HELP = "Utterances being spoken: HTTP speech requests, WebSocket utterances from first text to done."
_PROCESSES_FOLDER = "processes"
SINGLE_PROCESS = "server"
"""The ``process`` label of the one process of ``--workers 0``."""


@dataclass(frozen=True, slots=True)
class BuildInfo:
    """What ``voxwire_build_info`` says about the server: its version, the model it serves, the device(s)."""

    version: str
    model: str
    device: str
    """The configured device(s), comma-separated in ``--devices`` order; ``auto`` (CUDA when available) if none
    was given."""


DROP_REASONS = ("client_disconnected", "client_gone", "shutdown")
"""The reasons a session is dropped for besides the error code that ended it: an HTTP client that left
(``client_disconnected``), a WebSocket that broke mid-utterance (``client_gone``), an HTTP response cut by the
server's shutdown (``shutdown``). Their series start at 0, so ``voxwire_dropped_sessions_total`` is on a fresh
``/metrics`` (as the docs' table says) and a rate over it has a start."""


OTHER_FIELD = "other"
"""The ``voxwire_ignored_fields_total`` label of a field no request model declares."""


class Metrics:
    """Counters and histograms of one app; every method is cheap and safe on the event loop."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(
        self,
        engine_stats: Callable[[], Sequence[EngineStats]],
        connections: Callable[[], int],
        live_utterances: Callable[[], int],
        build: BuildInfo,
        *,
        multiprocess_dir: str | None = None,
    ) -> None:
        self.registry = CollectorRegistry()
        self._connections = connections
        self._live_utterances = live_utterances
        self._shared_gauges: tuple[Gauge, Gauge] | None = None
        if multiprocess_dir is None:
            self.registry.register(_LoadCollector(engine_stats, build, lambda: {SINGLE_PROCESS: os.getpid()}))
            self.registry.register(_LiveCollector(connections, live_utterances))
            self._exposed = self.registry
        else:
            self._exposed = CollectorRegistry()
            MultiProcessCollector(self._exposed, path=multiprocess_dir)
            self._exposed.register(_LoadCollector(engine_stats, build, lambda: registered_processes(multiprocess_dir)))
            self._shared_gauges = (
                Gauge(_CONNECTIONS, _CONNECTIONS_HELP, multiprocess_mode="livesum", registry=self.registry),
                Gauge(_UTTERANCES_LIVE, _UTTERANCES_LIVE_HELP, multiprocess_mode="livesum", registry=self.registry),
            )
        self._http_requests = Counter(
            "voxwire_http_requests",
            "HTTP requests answered, by method, route template (unmatched: no route) and status.",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self._http_duration = Histogram(
            "voxwire_http_request_duration_seconds",
            "From a request's arrival to the end of its response (a streamed one's last byte), by method and route "
            "template; WebSocket upgrades are not timed (their duration is the session's).",
            ["method", "route"],
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self._time_to_first_audio = Histogram(
            "voxwire_time_to_first_audio_seconds",
            "From a request (HTTP) or an utterance's first text (WebSocket) to its first audio chunk.",
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self._audio_seconds = Counter("voxwire_audio_seconds", "Seconds of audio produced.", registry=self.registry)
        self._errors = Counter(
            "voxwire_errors",
            "Errors returned to clients, by error code (a path that does not exist is no error: see "
            'voxwire_http_requests_total{route="unmatched"}).',
            ["code"],
            registry=self.registry,
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
        self._ignored_fields = Counter(
            "voxwire_ignored_fields",
            "Request body fields accepted without effect (X-Voxwire-Ignored-Fields), by field: a field another "
            "server defines (user, language, ...) by its name, any other as other.",
            ["field"],
            registry=self.registry,
        )
        self._ignored_fields.labels(field=OTHER_FIELD)  # exposed from 0, as the docs' table lists it
        for reason in DROP_REASONS:
            self._dropped_sessions.labels(reason=reason)

    def observe_http(self, method: str, route: str, status: int, seconds: float | None) -> None:
        """One HTTP request answered; ``seconds`` None: not timed (a WebSocket upgrade)."""
        self._http_requests.labels(method=method, route=route, status=str(status)).inc()
        if seconds is not None:
            self._http_duration.labels(method=method, route=route).observe(seconds)

    def observe_first_audio(self, seconds: float) -> None:
        self._time_to_first_audio.observe(seconds)

    def add_audio(self, seconds: float) -> None:
        self._audio_seconds.inc(seconds)

    def count_error(self, code: str) -> None:
        self._errors.labels(code=code).inc()

    def count_ignored_field(self, field: str) -> None:
        """One request field accepted without effect; ``field`` is a declared field's name or ``other`` (a client's
        names would make the label set unbounded)."""
        self._ignored_fields.labels(field=field).inc()

    def count_dropped(self, reason: str) -> None:
        self._dropped_sessions.labels(reason=reason).inc()

    def count_utterance(self, finish_reason: str) -> None:
        self._utterances.labels(finish_reason=finish_reason).inc()

    def refresh(self) -> None:
        """Publish this process's open connections and live utterances to the other frontends (multiprocess mode
        only)."""
        if self._shared_gauges is not None:
            connections, utterances = self._shared_gauges
            connections.set(self._connections())
            utterances.set(self._live_utterances())

    def exposition(self) -> bytes:
        """Every instrument (of every frontend, in multiprocess mode) in Prometheus' text format."""
        self.refresh()
        return generate_latest(self._exposed)


def register_process(multiprocess_dir: str | Path, role: str, pid: int) -> None:
    """Name process ``pid`` (``supervisor``, ``engine-0``, ``frontend-1``, ...) for the process metrics of
    ``--workers``; a restarted process's successor replaces it under the same name."""
    folder = Path(multiprocess_dir) / _PROCESSES_FOLDER
    folder.mkdir(exist_ok=True)
    written = folder / f".{role}.tmp"
    written.write_text(str(pid))
    written.replace(folder / role)  # atomic: a scrape never reads half a pid


def registered_processes(multiprocess_dir: str | Path) -> dict[str, int]:
    """The processes ``register_process`` named: {role: pid}."""
    folder = Path(multiprocess_dir) / _PROCESSES_FOLDER
    if not folder.is_dir():
        return {}
    found = {}
    for path in folder.iterdir():
        text = path.read_text().strip() if not path.name.startswith(".") else ""
        if text.isdigit():
            found[path.name] = int(text)
    return found


class _LiveCollector(Collector):
    """The one-process gauges read when scraped: open WebSocket connections and live utterances."""

    def __init__(self, connections: Callable[[], int], live_utterances: Callable[[], int]) -> None:
        self._connections = connections
        self._live_utterances = live_utterances

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(_CONNECTIONS, _CONNECTIONS_HELP, self._connections())
        yield GaugeMetricFamily(_UTTERANCES_LIVE, _UTTERANCES_LIVE_HELP, self._live_utterances())


class _LoadCollector(Collector):
    """Read when scraped: the build, each engine's load, step times and queue waits, each process's resources."""

    def __init__(
        self,
        engine_stats: Callable[[], Sequence[EngineStats]],
        build: BuildInfo,
        processes: Callable[[], Mapping[str, int]],
    ) -> None:
        """``processes``: {``process`` label: pid} of the processes whose CPU and memory to report."""
        self._engine_stats = engine_stats
        self._build = build
        self._processes = processes
        self._process_readers: dict[int, ProcessCollector] = {}

    def collect(self) -> Iterator[Metric]:
        build = GaugeMetricFamily(
            "voxwire_build_info",
            "Always 1; the labels say which voxwire version serves which model on which device(s).",
            labels=["version", "model", "device"],
        )
        build.add_metric([self._build.version, self._build.model, self._build.device], 1)
        yield build
        every = self._engine_stats()
        yield self._gauge(
            "voxwire_engine_requests_running",
            "Engine requests holding a slot: one per sentence being synthesized (of an HTTP request or a "
            "WebSocket utterance).",
            [s.running for s in every],
        )
        yield self._gauge(
            "voxwire_engine_requests_waiting", "Engine requests queued for a slot.", [s.waiting for s in every]
        )
        yield self._gauge(
            "voxwire_engine_batch_requests_running",
            "Of the engine requests holding a slot, those of priority batch (at most --max-batch-sessions).",
            [s.batch_running for s in every],
        )
        yield self._gauge(
            "voxwire_engine_batch_requests_waiting",
            "Of the engine requests queued for a slot, those of priority batch.",
            [s.batch_waiting for s in every],
        )
        rows = CounterMetricFamily(
            "voxwire_engine_rows",
            "Rows decoded by engine steps, by the priority of their requests (rows per step: its rate over "
            "voxwire_engine_step_seconds_count's).",
            labels=["engine", "priority"],
        )
        for index, stats in enumerate(every):
            rows.add_metric([str(index), Priority.REALTIME.value], stats.realtime_rows)
            rows.add_metric([str(index), Priority.BATCH.value], stats.batch_rows)
        yield rows
        used = [s.kv_blocks_used for s in every]
        yield self._gauge("voxwire_kv_blocks_used", "KV cache blocks held by running requests.", used)
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
        for index, stats in enumerate(every):
            captures.add_metric([str(index)], stats.graph_captures)
            capture_time.add_metric([str(index)], stats.graph_capture_seconds)
        yield captures
        yield capture_time
        yield self._histogram(
            "voxwire_engine_step_seconds",
            "Wall time of engine steps (one batched decode of every running request).",
            [s.step_times for s in every],
        )
        yield self._histogram(
            "voxwire_engine_queue_wait_seconds",
            "From an engine request's arrival at its engine to the step that admits it (gives it a slot).",
            [s.queue_waits for s in every],
        )
        yield from self._step_budget(every)
        yield from self._process_metrics()

    @staticmethod
    def _step_budget(every: Sequence[EngineStats]) -> Iterator[Metric]:
        """Why the real-time scheduler sheds new streams: each engine's measured step cost, the predicted step of
        its committed streams against its budget, and the streams shed (engines without a real-time budget, under
        ``--no-realtime``, have no step gauges)."""
        ratio = GaugeMetricFamily(
            "voxwire_step_cost_ratio",
            "Measured engine step time over the start-up step cost's prediction, over the last steps (1: as fast as "
            "at start-up; 3: three times slower).",
            labels=["engine"],
        )
        load = GaugeMetricFamily(
            "voxwire_step_load_seconds",
            "Predicted duration of an engine step decoding every committed stream once, at the measured step cost.",
            labels=["engine"],
        )
        budget = GaugeMetricFamily(
            "voxwire_step_budget_seconds",
            "The most that step may take (with a new stream) before new streams are refused busy: a share "
            "(--max-step-load) of a chunk's duration.",
            labels=["engine"],
        )
        shed = CounterMetricFamily(
            "voxwire_sessions_shed",
            "New streams refused busy because a step of the committed streams and the new one would exceed the step "
            "budget.",
            labels=["engine"],
        )
        for index, stats in enumerate(every):
            engine = [str(index)]
            if stats.step_cost_ratio is not None and stats.step_budget_s is not None:
                ratio.add_metric(engine, stats.step_cost_ratio)
                load.add_metric(engine, stats.step_load_s)
                budget.add_metric(engine, stats.step_budget_s)
            shed.add_metric(engine, stats.sessions_shed)
        yield from (ratio, load, budget, shed)

    def _process_metrics(self) -> Iterator[Metric]:
        """prometheus_client's process metrics (CPU, memory, file descriptors) of each process, labelled
        ``process``; a process that has just exited is left out."""
        processes = dict(self._processes())
        known = self._process_readers
        readers = {
            pid: known.get(pid) or ProcessCollector(pid=_fixed(pid), registry=None) for pid in processes.values()
        }
        self._process_readers = readers  # the readers of exited processes go
        families: dict[str, Metric] = {}
        for role, pid in sorted(processes.items()):
            for family in readers[pid].collect():
                merged = families.setdefault(family.name, Metric(family.name, family.documentation, family.type))
                for sample in family.samples:
                    merged.add_sample(sample.name, {**sample.labels, "process": role}, sample.value)
        yield from families.values()

    @staticmethod
    def _gauge(name: str, documentation: str, values: list[int]) -> GaugeMetricFamily:
        """A gauge with one sample per engine (label ``engine``: its index, ``--devices`` order)."""
        gauge = GaugeMetricFamily(name, documentation, labels=["engine"])
        for index, value in enumerate(values):
            gauge.add_metric([str(index)], value)
        return gauge

    @staticmethod
    def _histogram(name: str, documentation: str, values: list[LatencyHistogram]) -> HistogramMetricFamily:
        """A histogram per engine (label ``engine``), in ``LATENCY_BUCKETS_S``."""
        histogram = HistogramMetricFamily(name, documentation, labels=["engine"])
        for index, value in enumerate(values):
            buckets = [(_bound(bound), count) for bound, count in value.cumulative()]
            histogram.add_metric([str(index)], buckets, sum_value=value.total_s)
        return histogram


def _bound(seconds: float) -> str:
    """A bucket's ``le`` as prometheus_client writes its own histograms' (``0.1``, ``+Inf``)."""
    return "+Inf" if seconds == float("inf") else repr(seconds)


def _fixed(pid: int) -> Callable[[], int]:
    return lambda: pid
