"""``voxwire serve --workers N [--devices D,...]``: engine processes, frontends on one port, their supervisor.

The process that runs ``voxwire serve`` becomes the supervisor: it reserves the port, starts one
engine process per device (``engine_process.run_engine``: the model, the device, no event loop; one with
no ``--devices``) and N frontends (at least one with ``--devices``)
(``frontend.run_frontend``: an event loop each, with the WebSockets, the HTTP API, the Opus encoders), which all
listen on the port with ``SO_REUSEPORT`` so the kernel spreads connections over them, each once warmed up. Until
the first one joins, the supervisor answers on the port itself (``boot``'s starting app, from a thread: ``/ready`` 503
naming the engines' earliest start-up phase), so the port never refuses a connection while the model loads; frontend 0
is given those sockets and serves them once warmed up (a connection queued on them is not lost at the switch, as it
would be if the supervisor closed them). Then it watches:

- SIGHUP with ``--tls-cert``: every frontend loads the TLS files again (``edge.tls``); without TLS, as SIGTERM.
- SIGTERM/SIGINT (SIGHUP without TLS): the frontends drain (``/ready`` 503, live utterances finish, WebSockets
  close 1001), then the engine stops; exit 0.
- A frontend exits: only its connections end (the kernel closes them); it is started again, and the
  engines abort the requests the dead process left behind when the new one says hello.
- A child is hung (``liveness``: its heart thread silent for ``--liveness-timeout-s``, or its loop stuck past its
  stall bound): it is killed, with a log line saying which rule, how long and what it was doing; then its death
  takes the path below. A busy or CPU-starved child is never ended: its heart still beats.
- An engine exits after it served (crashed, killed, ended as hung): a successor is started (at most once a
  second), and every frontend is told (SIGUSR2, ``EngineDeaths``): it fails that engine's streams and calls with
  ``engine_restarted``, routes new utterances to the engines left (with one engine: refuses them, and ``/ready``
  answers 503 with ``Retry-After``), and reconnects to the successor, which rejoins once it welcomes the frontend
  (see ``proxy``). The supervisor's process never exits because an engine died.
- The service ends (every frontend told with SIGUSR1: ``/ready`` 503, streams ``unavailable``, close; exit 1)
  only when waiting cannot help: an engine that exits before it ever served (a bad checkpoint or ``--lora``),
  or a crash loop (``--crash-loop-deaths`` engine deaths, or as many frontend deaths, within
  ``--crash-loop-window-s``), named in the log.

Children stop on their own when the supervisor disappears (they watch their parent process id).
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.context
import os
import shutil
import signal
import socket
import tempfile
import time
from pathlib import Path
from types import FrameType

from prometheus_client import multiprocess

from voxwire.serving.boot import StartingListener, StartingThread, bind, urls
from voxwire.serving.edge.tls import server_certificate
from voxwire.serving.recovery import CrashLoop
from voxwire.serving.runtime.metrics import register_process
from voxwire.serving.server_config import ServerConfig
from voxwire.serving.workers.liveness import EngineDeaths, Pulses
from voxwire.startup import Readiness

logger = logging.getLogger(__name__)

_PHASE_ORDER = list(Readiness)
_STARTING_NEWS_S = 3.0
"""While no frontend serves, how often the supervisor logs the start-up's phase (``startup.PROGRESS_INTERVAL_S``'s
role for the children, whose imports log nothing)."""
_WATCH_S = 0.1
"""How often the supervisor looks at its children."""
_WATCH_GAP_S = 1.0
"""A watch that comes this late means the supervisor itself was not scheduled: silence is counted afresh."""
_RESTART_INTERVAL_S = 1.0
"""A frontend or engine that keeps dying is restarted at most this often."""
_STOP_GRACE_S = 15.0
"""After the drain timeout, how long a frontend may take to close before it is killed."""
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def supervise(config: ServerConfig) -> int:
    """Run the engines and ``config.topology.frontends`` frontends until a signal or an engine's death; the exit
    status."""
    context = multiprocessing.get_context("spawn")  # no fork: the engine may hold CUDA, frontends must not
    log_level = logging.getLevelName(logging.getLogger().getEffectiveLevel())
    _remove_stale_folders(Path(tempfile.gettempdir()))
    with tempfile.TemporaryDirectory(prefix=f"{_FOLDER_PREFIX}{os.getpid()}-") as folder:
        metrics_dir = Path(folder) / "metrics"
        metrics_dir.mkdir()
        # Read by prometheus_client when the frontends import it: their instruments write to shared files.
        os.environ[MULTIPROC_ENV] = str(metrics_dir)
        reserved = _reserve_port(config.transport.host, config.transport.port)
        wyoming: socket.socket | None = None
        try:
            if config.transport.wyoming_port is not None:  # every frontend listens on it too (serving/wyoming)
                wyoming = _reserve_port(config.transport.host, config.transport.wyoming_port)
                config = config.with_settings(wyoming_port=wyoming.getsockname()[1])
            config = config.with_settings(port=reserved.getsockname()[1])
            endpoints = tuple(f"ipc://{folder}/engine-{i}" for i in range(len(config.engine_devices())))
            supervisor = _Supervisor(context, config, endpoints, metrics_dir, log_level)
            return supervisor.run()
        finally:
            reserved.close()
            if wyoming is not None:
                wyoming.close()
            os.environ.pop(MULTIPROC_ENV, None)


_FOLDER_PREFIX = "voxwire-"
"""The supervisor's temporary folder (engine sockets, metrics files) is ``voxwire-<its pid>-<random>``."""


def _remove_stale_folders(temp: Path) -> None:
    """Remove the folders of supervisors that ended without cleaning up (SIGKILL, a power cut): every other exit
    path removes its own folder on the way out; this one can only be swept by the next start."""
    for folder in temp.glob(f"{_FOLDER_PREFIX}*-*"):
        pid = folder.name[len(_FOLDER_PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)) and folder.is_dir():
            logger.info("removing %s, left by a supervisor that is gone", folder)
            shutil.rmtree(folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive, and not ours to clean up after
        return True
    return True


def _reserve_port(host: str, port: int) -> socket.socket:
    """Bind (without listening) so that ``port`` 0 becomes one real port that every frontend then shares."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    reserved = socket.socket(family, socket.SOCK_STREAM)
    reserved.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    reserved.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    reserved.bind((host, port))
    return reserved


class _Supervisor:
    def __init__(
        self,
        context: multiprocessing.context.SpawnContext,
        config: ServerConfig,
        endpoints: tuple[str, ...],
        metrics_dir: Path,
        log_level: str,
    ) -> None:
        self.context = context
        self.config = config
        self.endpoints = endpoints
        self.metrics_dir = metrics_dir
        self.log_level = log_level
        self.frontends: dict[int, multiprocessing.process.BaseProcess] = {}
        self.started_at: dict[int, float] = {}
        self.stop_requested = False
        self.engine_count = len(endpoints)
        self.pulses = Pulses(context, self.engine_count + config.topology.frontends)
        """Heartbeats: engines in slots 0..engines-1, then the frontends."""
        self.engines: list[multiprocessing.process.BaseProcess] = []
        self.engine_started_at: list[float] = []
        self.deaths = EngineDeaths.create(context, self.engine_count)
        self.restarting: set[int] = set()
        """Engines that died and wait for their restart (``_RESTART_INTERVAL_S``)."""
        self.engine_crashes = CrashLoop(config, "engine")
        self.frontend_crashes = CrashLoop(config, "frontend")
        self.watched_since = time.monotonic()
        """Since when this loop has watched without a gap of its own (``Pulses.hang``)."""
        transport = config.transport
        self.certificate = server_certificate(transport.tls_cert, transport.tls_key)
        """The TLS pair, checked here so that a bad one stops the command before any child starts."""
        self.reload_requested = False
        self.starting_sockets = bind(transport.host, transport.port, reuse_port=True)
        tls = None if self.certificate is None else self.certificate.context
        self.starting = StartingThread(
            StartingListener(self.starting_sockets, transport.replica_id, tls, self._starting_phase),
            self._frontend_joined,
        )
        """Answers on the port (``boot``'s starting app, with the engines' phase) until a frontend joins it."""
        self.answering = True
        self.born = time.monotonic()

    def run(self) -> int:
        """Answer on the port as a starting server until a frontend joins it, and supervise; the exit status."""
        self.starting.start()
        for url in urls(self.starting_sockets, tls=self.certificate is not None):
            logger.info("listening on %s (starting: /ready answers 503 until a frontend is warmed up)", url)
        try:
            return self._supervise()
        finally:
            self._stop_answering()

    def _stop_answering(self) -> None:
        """The starting listener leaves the port (a frontend serves it now, or the server stops)."""
        self.starting.stop()
        for listener in self.starting_sockets:
            listener.close()

    def _starting_phase(self) -> Readiness:
        """The server's start-up phase while no frontend serves: the engines' earliest."""
        return min((self.pulses.phase(index) for index in range(self.engine_count)), key=_PHASE_ORDER.index)

    def _frontend_joined(self) -> bool:
        """Whether frontend 0, which holds the starting listener's sockets, serves them now (read from the starting
        thread too: shared memory only)."""
        return self.pulses.phase(self.engine_count) is Readiness.READY

    def _supervise(self) -> int:
        register_process(self.metrics_dir, "supervisor", os.getpid())
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, self._on_signal)
        for index in range(self.engine_count):
            self.engines.append(self._start_engine(index))
            self.engine_started_at.append(time.monotonic())
        for index in range(self.config.topology.frontends):
            self._start_frontend(index)
        logger.info("supervising %d engine(s) and %d frontend(s)", self.engine_count, self.config.topology.frontends)
        last_watch = last_news = time.monotonic()
        while not self.stop_requested:
            time.sleep(_WATCH_S)
            now = time.monotonic()
            if self.answering and self._frontend_joined():
                self.answering = False
                self._stop_answering()
            elif self.answering and now - last_news >= _STARTING_NEWS_S:
                last_news = now  # the children log their phases; this fills the silence of their imports
                logger.info("start-up: %s (%.0f s since the start)", self._starting_phase().value, now - self.born)
            if self.reload_requested:
                self.reload_requested = False
                self._reload_certificate()
            if now - last_watch > _WATCH_GAP_S:  # this process was not scheduled either: it saw nothing to judge
                self.watched_since = now
            last_watch = now
            for index in range(self.engine_count):
                failure = self._watch_engine(index)
                if failure is not None:
                    return self._service_ends(failure)
            for index, process in list(self.frontends.items()):
                self._end_if_hung(process, self.engine_count + index)
                if not process.is_alive() and not self.stop_requested:
                    failure = self._restart(index, process)
                    if failure is not None:
                        return self._service_ends(failure)
        return self._shutdown(self.engines)

    def _start_engine(self, index: int) -> multiprocessing.process.BaseProcess:
        from voxwire.serving.workers.engine_process import run_engine

        device = self.config.engine_devices()[index]
        # Each engine loads the model on its own device: its own KV pool, graphs and voice cache.
        config = self.config.with_settings(device=device, devices=())
        engine = self.context.Process(
            target=run_engine,
            args=(config, index, self.endpoints[index], self.log_level, self.pulses.pulse(index)),
            name=f"voxwire-engine-{index}",
        )
        engine.start()
        register_process(self.metrics_dir, f"engine-{index}", engine.pid or 0)
        logger.info("engine %d started on %s (pid %d)", index, device or "the default device", engine.pid)
        return engine

    def _watch_engine(self, index: int) -> str | None:
        """End engine ``index`` if hung; start a successor if it died. Why the service ends instead, if it must:
        the engine never served (a failure to start, not a crash), or its deaths are a crash loop."""
        engine = self.engines[index]
        if index not in self.restarting:
            self._end_if_hung(engine, index)
            if engine.is_alive():
                return None
            # Its stamp outlives it until its successor starts: a stamp means it served.
            if not (self.pulses.started(index) or self.deaths.read()[index] > 0):
                return f"{engine.name} exited with {engine.exitcode} before it served (see its log above)"
            if self.engine_crashes.died():
                return f"{engine.name} exited with {engine.exitcode}: {self.engine_crashes.describe()}"
            message = "%s (pid %s) exited with %s: its streams end with engine_restarted; starting a new one"
            logger.error(message, engine.name, engine.pid, engine.exitcode)
            self.restarting.add(index)
            self.deaths.died(index)
            self._tell_frontends(signal.SIGUSR2)
        if time.monotonic() - self.engine_started_at[index] >= _RESTART_INTERVAL_S:
            self.restarting.discard(index)
            self.engines[index] = self._start_engine(index)
            self.engine_started_at[index] = time.monotonic()
        return None

    def _tell_frontends(self, signum: signal.Signals) -> None:
        """Signal the frontends whose loop runs (a frontend still starting reads ``deaths`` at its first beat)."""
        for index, process in self.frontends.items():
            if process.pid is not None and process.is_alive() and self.pulses.started(self.engine_count + index):
                os.kill(process.pid, signum)

    def _end_if_hung(self, process: multiprocessing.process.BaseProcess, slot: int) -> None:
        """SIGKILL a hung child (``liveness``: no life, or no progress), saying why: its death then takes the path
        of any other."""
        hang = self.pulses.hang(slot, self.config.topology.liveness_timeout_s, self.watched_since)
        if hang is not None and process.is_alive():
            logger.error("%s (pid %s) %s: ending it", process.name, process.pid, hang.describe())
            process.kill()
            process.join()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGHUP and self.certificate is not None:
            self.reload_requested = True  # with TLS, SIGHUP reloads the certificate (as in one process)
        else:
            self.stop_requested = True

    def _reload_certificate(self) -> None:
        """SIGHUP with TLS: each frontend loads the files again, and so does the starting listener if it answers."""
        assert self.certificate is not None
        if self.answering:
            self.certificate.reload("SIGHUP")
        self._tell_frontends(signal.SIGHUP)

    def _start_frontend(self, index: int) -> None:
        from voxwire.serving.workers.frontend import run_frontend  # here: the port answers before it is imported

        pulse = self.pulses.pulse(self.engine_count + index)
        process = self.context.Process(
            target=run_frontend,
            args=(
                self.config,
                index,
                self.endpoints,
                str(self.metrics_dir),
                self.log_level,
                pulse,
                self.deaths,
                tuple(self.starting_sockets) if index == 0 and self.answering else (),
            ),
            name=f"voxwire-frontend-{index}",
        )
        process.start()
        register_process(self.metrics_dir, f"frontend-{index}", process.pid or 0)
        logger.info("frontend %d started (pid %d)", index, process.pid)
        self.frontends[index] = process
        self.started_at[index] = time.monotonic()

    def _restart(self, index: int, process: multiprocessing.process.BaseProcess) -> str | None:
        """Start a successor of frontend ``index``, which died; why the service ends instead (a crash loop)."""
        if time.monotonic() - self.started_at[index] < _RESTART_INTERVAL_S:
            return None  # it died at once: try again a little later rather than spin
        if self.frontend_crashes.died():
            return f"{process.name} exited with {process.exitcode}: {self.frontend_crashes.describe()}"
        logger.error("frontend %d (pid %s) exited with %s: restarting it", index, process.pid, process.exitcode)
        if process.pid is not None:
            multiprocess.mark_process_dead(process.pid, str(self.metrics_dir))
        self._start_frontend(index)
        return None

    def _shutdown(self, engines: list[multiprocessing.process.BaseProcess]) -> int:
        logger.info("shutting down: the frontends drain, then the engines stop")
        self._stop_frontends(signal.SIGTERM, self.config.limits.drain_timeout_s + _STOP_GRACE_S)
        _stop_engines(engines)
        logger.info("stopped")
        return 0 if all(engine.exitcode == 0 for engine in engines) else 1

    def _service_ends(self, reason: str) -> int:
        # Nothing can replace what failed: the whole server stops (exit 1), so that its orchestrator sees it.
        logger.error("%s: closing the frontends and the engines; the server exits 1", reason)
        self._stop_frontends(signal.SIGUSR1, _STOP_GRACE_S)
        _stop_engines(self.engines)
        return 1

    def _stop_frontends(self, signum: signal.Signals, timeout: float) -> None:
        for process in self.frontends.values():
            if process.pid is not None and process.is_alive():
                os.kill(process.pid, signum)
        deadline = time.monotonic() + timeout
        for process in self.frontends.values():
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                logger.error("frontend pid %s did not stop in time: killing it", process.pid)
                process.kill()
                process.join()


def _stop_engines(engines: list[multiprocessing.process.BaseProcess]) -> None:
    for engine in engines:
        if engine.is_alive():
            engine.terminate()
    deadline = time.monotonic() + _STOP_GRACE_S
    for engine in engines:
        engine.join(max(0.0, deadline - time.monotonic()))
        if engine.is_alive():
            logger.error("%s did not stop in %.0f s: killing it", engine.name, _STOP_GRACE_S)
            engine.kill()
            engine.join()
