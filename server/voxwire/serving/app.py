"""The aiohttp application: ``make_app`` wires the shared objects, routes and middlewares; lifecycle lives here.

Startup (``cleanup_ctx``): load saved voices, start the engines, then warm the model up with one
short utterance in the background, so ``/health`` answers at once and ``/ready`` turns 200 when the
first request would not pay for the warm-up. Shutdown is ``drain``, the one owner of it, run once however
many ask: ``/ready`` turns 503 and new work is refused, live utterances may finish for up to
``drain_timeout_s``, the WebSockets left are closed with 1001 (going away), and the engines stop;
``voxwire serve`` runs it on SIGTERM while still listening, so probes see the 503, and any other runner (a test
server) through aiohttp's ``on_shutdown`` hook.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import WSCloseCode, web

from voxwire import __version__
from voxwire.engine import SynthesisParams
from voxwire.serving.boot import REPLICA_HEADER, urls
from voxwire.serving.boot import run_loop as run_loop
from voxwire.serving.edge.api_errors import error_middleware
from voxwire.serving.edge.auth import DEMO_FILE_SUFFIXES, DEMO_FILES_PREFIX, add_cors_headers, auth_middleware
from voxwire.serving.edge.request_id import add_request_id_header
from voxwire.serving.edge.tls import ServerCertificate, server_certificate
from voxwire.serving.http.access_log import ACCESS_LOGGER, AccessLogger
from voxwire.serving.http.connections import ConnectionGuard, GuardedRunner, static_file
from voxwire.serving.http.elevenlabs_tts import add_elevenlabs_tts_routes
from voxwire.serving.http.loras import add_lora_routes
from voxwire.serving.http.model_listing import add_model_routes
from voxwire.serving.http.nanovllm import add_nanovllm_routes
from voxwire.serving.http.openai import add_openai_routes
from voxwire.serving.http.probes import add_probe_routes
from voxwire.serving.http.request_metrics import request_metrics_middleware
from voxwire.serving.http.trace_middleware import add_tracing, trace_middleware
from voxwire.serving.http.voices import add_voice_routes
from voxwire.serving.openapi import add_openapi_routes
from voxwire.serving.runtime.encoding import EncoderPool
from voxwire.serving.runtime.heap import freeze_startup_heap
from voxwire.serving.runtime.keys import (
    CONFIG_KEY,
    ENCODERS_KEY,
    ENGINES_KEY,
    INLINE_VOICES_KEY,
    KEYLESS_KEY,
    METRICS_KEY,
    SESSIONS_KEY,
    SPEAKER_KEY,
    STATE_KEY,
    VOICES_KEY,
    Phase,
    ServerState,
)
from voxwire.serving.runtime.metrics import BuildInfo, Metrics
from voxwire.serving.runtime.tracing import tracing_from_environment
from voxwire.serving.server_config import ServerConfig
from voxwire.serving.speech.inline_voices import InlineVoices
from voxwire.serving.speech.load import load_speech_model
from voxwire.serving.speech.service import Engines, SpeechJob, SpeechService
from voxwire.serving.speech.voice_store import VoiceStore
from voxwire.serving.ws.elevenlabs import add_elevenlabs_routes
from voxwire.serving.ws.handler import add_ws_routes
from voxwire.serving.wyoming.listener import add_wyoming_listener
from voxwire.speech_model import ModelInfo, SpeechModel
from voxwire.startup import Readiness, enter, reporting

logger = logging.getLogger(__name__)

_WARM_UP_TEXT = "Warming up."
_READY_POLL_S = 0.05
_JSON_OVERHEAD = 64 * 1024
"""Room for the JSON around an utterance's text in a request body."""

_PACKAGED_CLIENT_DIR = Path(__file__).resolve().parents[1] / "web"
CLIENT_DIR = (
    _PACKAGED_CLIENT_DIR
    if (_PACKAGED_CLIENT_DIR / "index.html").is_file()
    else Path(__file__).resolve().parents[3] / "client_js"
)
"""The browser library and demo page: ``voxwire/web/`` in a wheel (copied from ``client_js/`` by setup.py's
build step), else the repository's ``client_js/`` (an editable install)."""


def make_app(config: ServerConfig, *, model: SpeechModel | None = None) -> web.Application:
    """Build the one-process server's application; the model is loaded from ``config`` (blocking) unless given
    (tests, benchmarks)."""
    # The model's side, imported here: a --workers frontend imports this module for ``build_app`` and must not
    # load the model's code (torch).
    from voxwire.serving.speech.persona_registry import LocalPersonas, open_registry

    model = load_speech_model(config) if model is None else model
    registry = open_registry(model, config)  # a bad --lora stops the server here, before it listens
    service = SpeechService(model, config, LocalPersonas(registry) if registry is not None else None)
    settings = config.voices
    voices = VoiceStore(
        settings.voices_dir, model.info.name, model.patch_shape, settings.max_voices, settings.voice_aliases
    )
    app = build_app(config, service, voices)
    service.on_fatal = lambda reason: stop_failed(app, reason)
    return app


def stop_failed(app: web.Application, reason: str) -> None:
    """The server cannot go on serving (``reason``, logged): refuse new work, then stop with exit status 1."""
    logger.error("%s", reason)
    state = app[STATE_KEY]
    state.phase = Phase.DRAINING
    state.exit_status = 1
    state.stop.set()


def build_app(
    config: ServerConfig, engines: Engines, voices: VoiceStore, *, metrics_dir: str | None = None
) -> web.Application:
    """The application around engines: ``SpeechService`` (one process) or a frontend's ``EngineProxy``.

    ``metrics_dir``: the Prometheus multiprocess folder shared by the frontends of ``--workers``."""
    sessions: set[web.WebSocketResponse] = set()
    # UTF-8 text is at most 4 bytes a character; voice uploads are multipart and bounded separately.
    body_limit = 4 * config.limits.max_text_chars_per_utterance + _JSON_OVERHEAD
    middlewares = [request_metrics_middleware, trace_middleware, error_middleware, auth_middleware]
    app = web.Application(middlewares=middlewares, client_max_size=body_limit)
    app[CONFIG_KEY] = config
    app[ENGINES_KEY] = engines
    app[SPEAKER_KEY] = engines.speaker
    app[STATE_KEY] = ServerState()
    app[SESSIONS_KEY] = sessions
    app[KEYLESS_KEY] = set()
    app[ENCODERS_KEY] = EncoderPool(config.audio.encoder_threads)
    app[VOICES_KEY] = voices
    app[INLINE_VOICES_KEY] = InlineVoices(config.voices.inline_voices)
    state = app[STATE_KEY]
    app[METRICS_KEY] = Metrics(
        engines.engine_stats,
        lambda: len(sessions),
        lambda: state.live_utterances,
        build_info(config, engines.speaker.info),
        multiprocess_dir=metrics_dir,
    )
    add_tracing(app, tracing_from_environment())
    add_openai_routes(app)
    add_model_routes(app)
    add_voice_routes(app)
    add_lora_routes(app)
    add_probe_routes(app)
    add_ws_routes(app)
    add_elevenlabs_routes(app)
    add_elevenlabs_tts_routes(app)
    add_nanovllm_routes(app)
    add_demo_routes(app)
    add_openapi_routes(app)
    app.on_response_prepare.append(_name_replica)
    app.on_response_prepare.append(add_request_id_header)
    app.on_response_prepare.append(add_cors_headers)
    app.cleanup_ctx.append(_lifecycle)
    add_wyoming_listener(app)  # after _lifecycle: it starts once the engines do and stops before them
    app.on_shutdown.append(drain)
    return app


def build_info(config: ServerConfig, info: ModelInfo) -> BuildInfo:
    """What ``voxwire_build_info`` reports: this version, the model's public name, the configured device(s)."""
    devices = ",".join(device or "auto" for device in config.engine_devices())
    return BuildInfo(__version__, info.name, devices)


async def _name_replica(request: web.Request, response: web.StreamResponse) -> None:
    """Every response (errors and the WebSocket 101 too) says which replica answered, for behind a balancer."""
    response.headers[REPLICA_HEADER] = request.app[CONFIG_KEY].transport.replica_id


def add_demo_routes(app: web.Application, client_dir: Path = CLIENT_DIR) -> None:
    """``/`` serves the demo page, ``/client/<file>`` the browser modules; nothing when ``client_js/`` is absent.

    Only top-level page and module files are served (not tests, ``package.json`` or ``node_modules``).
    """
    if not (client_dir / "index.html").is_file():
        logger.info("no demo page: %s is not there", client_dir)
        return
    files = {
        path.name: path
        for path in client_dir.iterdir()
        if path.is_file() and path.suffix in DEMO_FILE_SUFFIXES and not path.name.endswith(".test.js")
    }

    async def index(request: web.Request) -> web.Response:
        return await static_file(files["index.html"])

    async def client_file(request: web.Request) -> web.Response:
        path = files.get(request.match_info["name"])
        if path is None:
            raise web.HTTPNotFound()
        return await static_file(path)

    app.router.add_get("/", index)
    app.router.add_get(DEMO_FILES_PREFIX + "{name}", client_file)


def make_runner(app: web.Application, **options: Any) -> web.AppRunner:
    """The runner of every server (and test server): ``runner_options``, and connections guarded by
    ``http.connections`` (a write deadline, a cap per process, client protocol errors logged per interval)."""
    config = app[CONFIG_KEY]
    guard = ConnectionGuard(config.limits, {REPLICA_HEADER: config.transport.replica_id})
    return GuardedRunner(app, guard, **runner_options(config), **options)


def runner_options(config: ServerConfig) -> dict[str, Any]:
    """``web.AppRunner`` settings the server needs: the header timeout and the query-free access log.

    aiohttp closes a connection whose request headers are not complete when its keep-alive timer
    fires, and starts that timer when the connection opens: ``keepalive_timeout`` is therefore the
    header timeout (for a fresh connection and between keep-alive requests alike).
    """
    return {
        "keepalive_timeout": config.limits.header_timeout_s,
        "access_log_class": AccessLogger,
        "access_log": ACCESS_LOGGER,
    }


async def _lifecycle(app: web.Application) -> AsyncIterator[None]:
    """Start the engines and warm them up; at cleanup, after the drain (``on_shutdown``) stopped the engines, end the
    warm-up if it still runs and the encoder threads."""
    await asyncio.to_thread(app[VOICES_KEY].load)
    await app[ENGINES_KEY].start()
    warm_up = asyncio.create_task(_warm_up(app), name="voxwire-warm-up")
    try:
        yield
    finally:
        warm_up.cancel()
        await asyncio.gather(warm_up, return_exceptions=True)
        app[ENCODERS_KEY].close()


async def _warm_up(app: web.Application) -> None:
    """Run one short utterance through each engine, then open for work (unless shutdown began)."""
    state = app[STATE_KEY]
    started = time.perf_counter()
    params = SynthesisParams(seed=0, max_len=2)
    speakers = app[ENGINES_KEY].engine_speakers()
    try:
        with reporting():
            enter(Readiness.WARMING_UP, "one short utterance on each of %d engine(s)", len(speakers))
            for speaker in speakers:
                async for _ in speaker.speak(SpeechJob(speaker.new_request_id("warm-up"), _WARM_UP_TEXT, params)):
                    pass
    except Exception:
        logger.exception("the warm-up utterance failed: the server stays not ready")
        return
    if state.phase is Phase.STARTING:
        state.phase = Phase.READY
        info = app[SPEAKER_KEY].info
        seconds = time.perf_counter() - started
        logger.info("model %s warmed up in %.1f s; ready (%d Hz)", info.name, seconds, info.sample_rate)


async def drain(app: web.Application) -> None:
    """Graceful shutdown: refuse new work, let live utterances finish (bounded), close sockets, stop the engines.

    It runs once, however many ask (``run_app`` while still listening, then aiohttp's ``on_shutdown`` as the
    listener closes; a test): a later call waits for the first one's end. Shielded, so that a caller cancelled
    meanwhile does not leave the engines running for the next one."""
    state = app[STATE_KEY]
    if state.drain is None:
        state.drain = asyncio.create_task(_drain(app), name="voxwire-drain")
    await asyncio.shield(state.drain)


async def _drain(app: web.Application) -> None:
    state, config = app[STATE_KEY], app[CONFIG_KEY]
    state.phase = Phase.DRAINING
    if not await state.wait_idle(config.limits.drain_timeout_s):
        live = state.live_utterances
        logger.warning("drain timeout (%.0f s): cutting off %d live utterance(s)", config.limits.drain_timeout_s, live)
    sockets = [*app[SESSIONS_KEY], *app[KEYLESS_KEY]]
    closing = [ws.close(code=WSCloseCode.GOING_AWAY, message=b"server shutting down") for ws in sockets]
    await asyncio.gather(*closing, return_exceptions=True)
    await app[ENGINES_KEY].stop()


async def _freeze_when_ready(app: web.Application) -> None:
    """Wait for the warm-up, then take the startup heap out of garbage collection (see ``heap``)."""
    while not app[STATE_KEY].accepting:
        await asyncio.sleep(_READY_POLL_S)
    freeze_startup_heap("server")


@dataclass(frozen=True)
class Listening:
    """Listening sockets a starting app answered on while the model loaded (``boot``), which ``run_app`` serves:
    the server's own (one process), or the supervisor's, handed to a frontend (``--workers``)."""

    sockets: Sequence[socket.socket]
    certificate: ServerCertificate | None
    close_starting: Callable[[], Awaitable[None]] | None = None
    """Closes the starting app once this app serves the sockets (one process; a frontend's supervisor closes its own
    when the frontend has joined)."""


async def run_app(
    app: web.Application,
    config: ServerConfig,
    *,
    reuse_port: bool = False,
    listening: Listening | None = None,
    joined: Callable[[], None] = lambda: None,
) -> int:
    """Listen, wait for SIGTERM or SIGINT (or the app's ``ServerState.stop``), drain, close; the exit status
    (``ServerState.exit_status``). ``reuse_port``: share the port with other processes (``SO_REUSEPORT``: the
    kernel spreads connections over them); such a process joins the port only once warmed up, so no connection
    lands on one that cannot serve it yet, and then calls ``joined``. ``listening``: serve these sockets rather than
    bind the port (``boot``).

    With ``--tls-cert`` every listener speaks TLS, its pair reloaded on SIGHUP and when the files change."""
    transport = config.transport
    if listening is None:
        certificate = server_certificate(transport.tls_cert, transport.tls_key)
    else:
        certificate = listening.certificate
    tls = None if certificate is None else certificate.context
    loop = asyncio.get_running_loop()
    if certificate is not None:  # before the first await: a frontend is told SIGHUP once its loop turns
        loop.add_signal_handler(signal.SIGHUP, certificate.reload, "SIGHUP")
    runner = make_runner(app, handle_signals=False)
    await runner.setup()
    ready = asyncio.create_task(_freeze_when_ready(app), name="voxwire-freeze-heap")
    watch = None if certificate is None else asyncio.create_task(certificate.watch(transport.tls_poll_s))
    try:
        if reuse_port:
            await asyncio.shield(ready)
        if listening is not None:
            for listener in listening.sockets:
                await web.SockSite(runner, listener, ssl_context=tls).start()
            if listening.close_starting is not None:
                await listening.close_starting()
            for url in urls(listening.sockets, tls=tls is not None):
                logger.info("listening on %s (the starting app's port, taken over)", url)
        else:
            site = web.TCPSite(runner, transport.host, transport.port, reuse_port=reuse_port or None, ssl_context=tls)
            await site.start()
            scheme = "http" if tls is None else "https"
            for host, port, *_ in runner.addresses:
                logger.info("listening on %s://%s:%d", scheme, host, port)
        joined()
        stop = app[STATE_KEY].stop
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await stop.wait()
        logger.info("shutting down: draining live utterances (at most %.0f s)", config.limits.drain_timeout_s)
        await drain(app)
    finally:
        ready.cancel()
        if watch is not None:
            watch.cancel()
        await runner.cleanup()
    logger.info("stopped")
    return app[STATE_KEY].exit_status
