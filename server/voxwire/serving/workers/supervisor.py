"""``voxwire serve --workers N [--devices D,...]``: engine processes, frontends on one port, their supervisor.

The process that runs ``voxwire serve`` becomes the supervisor: it reserves the port, starts one
engine process per device (``engine_process.run_engine``: the model, the device, no event loop; one with
no ``--devices``) and N frontends (at least one with ``--devices``)
(``frontend.run_frontend``: an event loop each, with the WebSockets, the HTTP API, the Opus encoders), which all
listen on the port with ``SO_REUSEPORT`` so the kernel spreads connections over them. Then it watches:

- SIGTERM/SIGINT: the frontends drain (``/ready`` 503, live utterances finish, WebSockets close 1001),
  then the engine stops; exit 0.
- A frontend exits: only its connections end (the kernel closes them); it is started again, and the
  engines abort the requests the dead process left behind when the new one says hello.
- An engine exits while another engine serves (``--devices``; it served before, so its death is not a failure
  to start): it is restarted (at most once a second), and every frontend is told (SIGUSR2, ``EngineDeaths``):
  it fails that engine's streams and calls as ``unavailable``, routes new utterances to the engines left, and
  reconnects to the successor, which rejoins once it welcomes the frontend (see ``proxy``).
- An engine exits and no other serves (one engine; an engine that never served, e.g. a bad ``--lora``; the last
  one left): every frontend is told (SIGUSR1): it turns ``/ready`` 503, fails its streams as ``unavailable``
  and closes; exit 1.

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

from voxwire.serving.config import ServerConfig
from voxwire.serving.metrics import register_process
from voxwire.serving.workers.frontend import run_frontend
from voxwire.serving.workers.liveness import EngineDeaths, Pulses

logger = logging.getLogger(__name__)

_WATCH_S = 0.1
"""How often the supervisor looks at its children."""
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
        try:
            port = reserved.getsockname()[1]
            endpoints = tuple(f"ipc://{folder}/engine-{i}" for i in range(len(config.engine_devices())))
            supervisor = _Supervisor(context, config.with_settings(port=port), endpoints, metrics_dir, log_level)
            return supervisor.run()
        finally:
            reserved.close()
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

    def run(self) -> int:
        register_process(self.metrics_dir, "supervisor", os.getpid())
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, self._on_signal)
        for index in range(self.engine_count):
            self.engines.append(self._start_engine(index))
            self.engine_started_at.append(time.monotonic())
        for index in range(self.config.topology.frontends):
            self._start_frontend(index)
        logger.info("supervising %d engine(s) and %d frontend(s)", self.engine_count, self.config.topology.frontends)
        while not self.stop_requested:
            time.sleep(_WATCH_S)
            for index in range(self.engine_count):
                if not self._watch_engine(index):
                    return self._engines_gone(self.engines[index])
            for index, process in list(self.frontends.items()):
                self._end_if_silent(process, self.engine_count + index)
                if not process.is_alive() and not self.stop_requested:
                    self._restart(index, process)
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

    def _watch_engine(self, index: int) -> bool:
        """End engine ``index`` if hung, restart it if it died while another engine serves; False when its death
        ends the service (no other engine serves, or it never served: a failure to start, not a crash)."""
        engine = self.engines[index]
        if index not in self.restarting:
            self._end_if_silent(engine, index)
            if engine.is_alive():
                return True
            # Its stamp outlives it until its successor starts: a stamp means it served.
            served = self.pulses.started(index) or self.deaths.read()[index] > 0
            if not served or not any(self._serves(other) for other in range(self.engine_count) if other != index):
                return False
            message = "%s (pid %s) exited with %s: ending its streams and restarting it"
            logger.error(message, engine.name, engine.pid, engine.exitcode)
            self.restarting.add(index)
            self.deaths.died(index)
            self._tell_frontends(signal.SIGUSR2)
        if time.monotonic() - self.engine_started_at[index] >= _RESTART_INTERVAL_S:
            self.restarting.discard(index)
            self.engines[index] = self._start_engine(index)
            self.engine_started_at[index] = time.monotonic()
        return True

    def _serves(self, index: int) -> bool:
        """Whether engine ``index``'s process is alive and its loop has run since it was (re)started."""
        return index not in self.restarting and self.engines[index].is_alive() and self.pulses.started(index)

    def _tell_frontends(self, signum: signal.Signals) -> None:
        """Signal the frontends whose loop runs (a frontend still starting reads ``deaths`` at its first beat)."""
        for index, process in self.frontends.items():
            if process.pid is not None and process.is_alive() and self.pulses.started(self.engine_count + index):
                os.kill(process.pid, signum)

    def _end_if_silent(self, process: multiprocessing.process.BaseProcess, slot: int) -> None:
        """SIGKILL a hung child (see ``liveness``): its death then takes the path of any other."""
        silence = self.pulses.silent(slot, self.config.topology.liveness_timeout_s)
        if silence is not None and process.is_alive():
            logger.error("%s (pid %s) showed no life for %.1f s: ending it", process.name, process.pid, silence)
            process.kill()
            process.join()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.stop_requested = True

    def _start_frontend(self, index: int) -> None:
        pulse = self.pulses.pulse(self.engine_count + index)
        process = self.context.Process(
            target=run_frontend,
            args=(self.config, index, self.endpoints, str(self.metrics_dir), self.log_level, pulse, self.deaths),
            name=f"voxwire-frontend-{index}",
        )
        process.start()
        register_process(self.metrics_dir, f"frontend-{index}", process.pid or 0)
        logger.info("frontend %d started (pid %d)", index, process.pid)
        self.frontends[index] = process
        self.started_at[index] = time.monotonic()

    def _restart(self, index: int, process: multiprocessing.process.BaseProcess) -> None:
        if time.monotonic() - self.started_at[index] < _RESTART_INTERVAL_S:
            return  # it died at once: try again a little later rather than spin
        logger.error("frontend %d (pid %s) exited with %s: restarting it", index, process.pid, process.exitcode)
        if process.pid is not None:
            multiprocess.mark_process_dead(process.pid, str(self.metrics_dir))
        self._start_frontend(index)

    def _shutdown(self, engines: list[multiprocessing.process.BaseProcess]) -> int:
        logger.info("shutting down: the frontends drain, then the engines stop")
        self._stop_frontends(signal.SIGTERM, self.config.limits.drain_timeout_s + _STOP_GRACE_S)
        _stop_engines(engines)
        logger.info("stopped")
        return 0 if all(engine.exitcode == 0 for engine in engines) else 1

    def _engines_gone(self, dead: multiprocessing.process.BaseProcess) -> int:
        # No engine is left to serve (or one failed to start): the whole server stops (exit 1) and its
        # orchestrator restarts it, as with one engine.
        logger.error("%s exited with %s: closing the frontends and the other engines", dead.name, dead.exitcode)
        self._stop_frontends(signal.SIGUSR1, _STOP_GRACE_S)
        _stop_engines([engine for engine in self.engines if engine is not dead])
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
