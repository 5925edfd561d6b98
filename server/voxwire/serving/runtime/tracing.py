"""Optional OpenTelemetry traces (the ``voxwire[otel]`` extra): ``tracing_from_environment``, ``Tracing``.

Traces are on when the standard OpenTelemetry environment asks for them: ``OTEL_TRACES_EXPORTER`` names an exporter
(anything but ``none``), or an OTLP endpoint is set (``OTEL_EXPORTER_OTLP_ENDPOINT``,
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``), and ``OTEL_SDK_DISABLED`` is not ``true``. Otherwise this module imports
nothing of opentelemetry and the server pays one dictionary look-up a request. The rest is the SDK reading the same
environment: the exporters' endpoints, headers and timeouts, ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES``
(the service is ``voxwire`` unless they name it), the sampler (``OTEL_TRACES_SAMPLER``), the batch processor's limits
(``OTEL_BSP_*``) and the propagators (``OTEL_PROPAGATORS``: W3C ``traceparent``/``tracestate`` and baggage unless
set). ``otlp`` exports over HTTP/protobuf (the OpenTelemetry default; the extra installs it) unless
``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` or ``OTEL_EXPORTER_OTLP_PROTOCOL`` says ``grpc``.

The spans (see docs/operations.md): one ``SERVER`` span per HTTP request, a child of the caller's ``traceparent``
(the WebSocket's lasts as long as its connection); under a speech request, ``voxwire.utterance`` from the job's
submission to its last audio (under a WebSocket, ``voxwire.segment`` for each sentence, each an engine request),
with a ``voxwire.first_audio`` child that ends when the first audio arrives, a ``voxwire.queue`` child for the wait
for an engine slot (from the submission, as long as the engine measured the request waiting: ``Chunk.queued_s``;
the rest of ``first_audio`` is the hop to the engine, the prefill and the first step), and one
``voxwire.engine_step`` child per engine output, from the start to the end of the step that made it (``Chunk.step``:
each output is one engine step's patch of this utterance; the step is shared by the batch, so each utterance in it
has a span of the same times).

Every span is made in the process that serves the request, the engine's spans included: the engine stamps each
step's wall-clock start and duration on its outputs (the host's clock, which every process of the server shares),
and they travel with the outputs. So with ``--workers`` the frontends export every span; the engine processes make
none and need no exporter.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import AsyncGenerator, Callable, Iterator, Mapping
from contextlib import contextmanager
from types import TracebackType
from typing import TYPE_CHECKING

import voxwire
from voxwire.chunk import Chunk, EngineStep

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Span, Tracer, TracerProvider

logger = logging.getLogger(__name__)

SERVICE_NAME = "voxwire"
"""The ``service.name`` of the spans unless ``OTEL_SERVICE_NAME`` or ``OTEL_RESOURCE_ATTRIBUTES`` names another."""
_OTLP_ENDPOINTS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
_OTLP_PROTOCOLS = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
_EXPORTER_ENTRY_POINTS = "opentelemetry_traces_exporter"
_EXTRA_HINT = "pip install 'voxwire[otel]'"
CLIENT_LEFT = (asyncio.CancelledError, ConnectionResetError, GeneratorExit)
"""How a request ends when its client leaves or stops it (aiohttp cancels the handler, a write fails, a WebSocket
utterance is cancelled, its stream closed before its end): not a server error."""
UTTERANCE_SPAN = "voxwire.utterance"
SEGMENT_SPAN = "voxwire.segment"


def tracing_requested(environ: Mapping[str, str]) -> bool:
    """Whether the OpenTelemetry environment asks for traces to be exported (read without importing opentelemetry)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporters:
        return exporters != "none"
    return any(environ.get(name) for name in _OTLP_ENDPOINTS)


def tracing_from_environment(environ: Mapping[str, str] = os.environ) -> Tracing | None:
    """The server's tracing as the ``OTEL_*`` environment configures it; None (nothing imported) when it is off,
    or when it asks for traces that cannot be sent (the extra is not installed, no exporter could be made)."""
    if not tracing_requested(environ):
        return None
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        logger.warning("OTEL_* asks for traces but opentelemetry-sdk is not installed (%s): no traces", _EXTRA_HINT)
        return None
    exporters = _exporters(environ)
    if not exporters:
        return None
    resource = Resource.create()
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": SERVICE_NAME}))
    provider = TracerProvider(resource=resource)
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    logger.info("tracing on: spans go to %s", ", ".join(type(exporter).__name__ for exporter in exporters))
    return Tracing(provider, shutdown=provider.shutdown)


def _exporters(environ: Mapping[str, str]) -> list[SpanExporter]:
    """The span exporters ``OTEL_TRACES_EXPORTER`` names (``otlp`` by default), by the SDK's entry points."""
    from importlib.metadata import entry_points

    names = [name.strip().lower() for name in environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",") if name.strip()]
    exporters = []
    for name in names:
        if name == "otlp":
            grpc = next((environ[key] for key in _OTLP_PROTOCOLS if environ.get(key)), "").strip().lower() == "grpc"
            name = "otlp_proto_grpc" if grpc else "otlp_proto_http"
        found = entry_points(group=_EXPORTER_ENTRY_POINTS, name=name)
        if not found:
            logger.error("OTEL_TRACES_EXPORTER names %r, which no installed package provides (%s)", name, _EXTRA_HINT)
            continue
        exporters.append(next(iter(found)).load()())
    return exporters


class Tracing:
    """Makes the server's spans with one tracer; ``shutdown`` (when given) flushes and closes its exporters."""

    def __init__(self, provider: TracerProvider, *, shutdown: Callable[[], object] | None = None) -> None:
        from opentelemetry import propagate

        self._tracer = provider.get_tracer("voxwire", voxwire.__version__)
        self._propagator = propagate.get_global_textmap()
        self._shutdown = shutdown

    def shutdown(self, timeout_s: float) -> None:
        """Flush and close the exporters, waiting for them at most ``timeout_s``. The SDK's shutdown waits for an
        export in flight as long as the exporter's own timeout allows (30 s and more on a collector that accepts
        and never answers), so it runs on a daemon thread that the process may exit without."""
        if self._shutdown is None:
            return
        closing = threading.Thread(target=self._shutdown, name="voxwire-trace-shutdown", daemon=True)
        closing.start()
        closing.join(timeout_s)
        if closing.is_alive():
            logger.warning("the span exporters did not finish in %.1f s: stopping without the spans left", timeout_s)

    @contextmanager
    def server_span(self, name: str, headers: Mapping[str, str], attributes: Mapping[str, str]) -> Iterator[ServerSpan]:
        """A ``SERVER`` span, current while the block runs, continuing the trace the headers name (``traceparent``)."""
        from opentelemetry.trace import SpanKind, StatusCode

        parent = self._propagator.extract(headers)
        # The status is set here: a client that leaves mid-stream is not a server failure.
        started = self._tracer.start_as_current_span(
            name, context=parent, kind=SpanKind.SERVER, attributes=attributes, set_status_on_exception=False
        )
        with started as span:
            try:
                yield ServerSpan(span)
            except CLIENT_LEFT:
                raise
            except Exception as exc:  # a stream cut short (the response had begun); recorded by the span
                span.set_status(StatusCode.ERROR, str(exc) or type(exc).__name__)
                raise

    def utterance(
        self, name: str = UTTERANCE_SPAN, attributes: Mapping[str, str | int] | None = None
    ) -> UtteranceTrace:
        """The spans of one engine request, children of the current span (the request's): named ``name``
        (``SEGMENT_SPAN`` for a WebSocket utterance's sentence), with ``attributes``."""
        return _TracedUtterance(self._tracer, name, attributes or {})


class ServerSpan:
    """The request's span, as the HTTP middleware sees it."""

    def __init__(self, span: Span) -> None:
        self._span = span

    def set_status_code(self, status: int) -> None:
        """The response's status; a 5xx marks the span as failed (a 4xx is the client's error, not the server's)."""
        from opentelemetry.trace import StatusCode

        self._span.set_attribute("http.response.status_code", status)
        if status >= 500:
            self._span.set_status(StatusCode.ERROR)


class UtteranceTrace:
    """One utterance's spans: this base class makes none (tracing off); use it as a context manager."""

    def output(self, chunk: Chunk) -> None:
        """An engine output of the utterance has arrived."""

    def __enter__(self) -> UtteranceTrace:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None


UNTRACED = UtteranceTrace()


async def traced(outputs: AsyncGenerator[Chunk, None], trace: UtteranceTrace) -> AsyncGenerator[Chunk, None]:
    """``outputs``, each recorded on ``trace`` as it passes; the trace's spans end with the stream (closing this
    closes ``outputs``)."""
    async with contextlib.aclosing(outputs):
        with trace:
            async for chunk in outputs:
                trace.output(chunk)
                yield chunk


class _TracedUtterance(UtteranceTrace):
    def __init__(self, tracer: Tracer, name: str, attributes: Mapping[str, str | int]) -> None:
        from opentelemetry.trace import set_span_in_context

        self._tracer = tracer
        self._started_ns = time.time_ns()
        self._span = tracer.start_span(name, start_time=self._started_ns, attributes=attributes)
        self._context = set_span_in_context(self._span)
        self._first_audio: Span | None = tracer.start_span(
            "voxwire.first_audio", self._context, start_time=self._started_ns
        )
        self._outputs = 0
        self._samples = 0

    def output(self, chunk: Chunk) -> None:
        if chunk.queued_s is not None:
            queue = self._tracer.start_span("voxwire.queue", self._context, start_time=self._started_ns)
            queue.end(min(time.time_ns(), self._started_ns + round(chunk.queued_s * 1e9)))
        if self._first_audio is not None:
            self._first_audio.end()
            self._first_audio = None
        samples = int(chunk.audio.size)
        if chunk.step is not None:
            self._engine_step(chunk, chunk.step, samples)
        self._outputs += 1
        self._samples += samples
        if chunk.finish_reason is not None:
            self._span.set_attribute("voxwire.finish_reason", chunk.finish_reason.value)

    def _engine_step(self, chunk: Chunk, step: EngineStep, samples: int) -> None:
        """The span of the engine step that made ``chunk``, at the step's own times (taken by the engine)."""
        attributes: dict[str, str | int] = {
            "voxwire.engine_step.rows": step.rows,
            "voxwire.output.index": self._outputs,
            "voxwire.output.samples": samples,
        }
        if chunk.finish_reason is not None:
            attributes["voxwire.finish_reason"] = chunk.finish_reason.value
        span = self._tracer.start_span(
            "voxwire.engine_step", self._context, attributes=attributes, start_time=step.started_ns
        )
        span.end(step.ended_ns)

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        from opentelemetry.trace import StatusCode

        self._span.set_attributes({"voxwire.outputs": self._outputs, "voxwire.audio_samples": self._samples})
        if exc is not None:
            self._span.record_exception(exc)
            if not isinstance(exc, CLIENT_LEFT):
                self._span.set_status(StatusCode.ERROR, str(exc) or type(exc).__name__)
        if self._first_audio is not None:
            self._first_audio.end()
        self._span.end()
