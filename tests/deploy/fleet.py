"""Real processes on loopback for the load-balancer test: ``voxwire serve`` replicas, HAProxy and nginx running
the shipped configurations (rendered by ``scripts/deploy/render.py`` with free ports), and a streaming client that
records which replica served it and every byte of audio it heard."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from tests.script_modules import load_script
from tests.server_process import http_status

from voxwire.client.connection import Connection
from voxwire.client.errors import ClientError
from voxwire.protocol.wire import AudioFrame, Done, End, Error, Start, Text

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "scripts" / "deploy"
REPLICA_HEADER = "X-Voxwire-Replica"
START_TIMEOUT_S = 120.0
"""Three interpreters importing torch at once on two shared cores: generous."""


def load_render() -> ModuleType:
    """``scripts/deploy/render.py`` as a module (scripts are not a package)."""
    return load_script(DEPLOY / "render.py", "voxwire_deploy_render")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def http_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.read().decode()


def wait_for(condition: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


@dataclass
class Process:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""


@dataclass
class Replica(Process):
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass
class Fleet:
    """Everything started, stopped (killed if need be) when the ``with`` block ends."""

    workdir: Path
    processes: list[Process] = field(default_factory=list)

    def start(self, name: str, command: list[str], **extra: int) -> Process:
        log = self.workdir / f"{name}.log"
        with log.open("wb") as out:
            env = {**os.environ, "OMP_NUM_THREADS": "1"}
            popen = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
        process = (Replica if extra else Process)(name, popen, log, **extra)
        self.processes.append(process)
        return process

    def replica(self, name: str, *flags: str) -> Replica:
        port = free_port()
        command = [sys.executable, "-m", "voxwire.cli.main", "serve", "--port", str(port), "--replica-id", name]
        command += ["--workers", "0"]  # each replica in one process: the fleet tests are about balancing
        replica = self.start(name, [*command, *flags], port=port)
        assert isinstance(replica, Replica)
        return replica

    def haproxy(self, replicas: list[Replica]) -> str:
        port = free_port()
        config = self.workdir / "haproxy.cfg"
        config.write_text(_render("haproxy", f"127.0.0.1:{port}", replicas))
        self.start("haproxy", [_binary("haproxy"), "-db", "-f", str(config)])
        return f"http://127.0.0.1:{port}"

    def nginx(self, replicas: list[Replica]) -> str:
        port = free_port()
        prefix = self.workdir / "nginx"
        prefix.mkdir()
        (prefix / "voxwire.conf").write_text(_render("nginx", f"127.0.0.1:{port}", replicas))
        # The shipped file is an http-level include; this is the smallest main file a non-root nginx runs with.
        kinds = ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
        temp = " ".join(f"{kind}_temp_path {prefix / kind};" for kind in kinds)
        (prefix / "nginx.conf").write_text(
            f"pid {prefix / 'nginx.pid'};\nerror_log stderr notice;\nevents {{}}\n"
            f"http {{\n    access_log off;\n    {temp}\n    include {prefix / 'voxwire.conf'};\n}}\n"
        )
        command = [_binary("nginx"), "-e", "stderr", "-p", str(prefix), "-c", str(prefix / "nginx.conf")]
        self.start("nginx", [*command, "-g", "daemon off;"])
        return f"http://127.0.0.1:{port}"

    def wait_ready(self, url: str) -> None:
        wait_for(lambda: http_status(f"{url}/ready") == 200, START_TIMEOUT_S, f"{url}/ready")

    def stop_all(self) -> None:
        for process in self.processes:
            if process.popen.poll() is None:
                process.popen.send_signal(signal.SIGKILL)
        for process in self.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.popen.wait(timeout=10)

    def logs(self) -> str:
        return "\n".join(f"---- {process.name}\n{process.tail()}" for process in self.processes)


@contextlib.contextmanager
def fleet(workdir: Path) -> Iterator[Fleet]:
    running = Fleet(workdir)
    try:
        yield running
    except BaseException:
        print(running.logs(), file=sys.stderr)  # shown by pytest for a failed test
        raise
    finally:
        running.stop_all()


def _binary(name: str) -> str:
    # Debian puts both in /usr/sbin, which is not on every user's PATH.
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/local/sbin")
    assert found is not None, f"{name} is not installed"
    return found


def has_binary(name: str) -> bool:
    return (shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/local/sbin")) is not None


def _render(kind: str, listen: str, replicas: list[Replica]) -> str:
    render = load_render()
    return render.render(kind, listen, render.Upstreams(tuple(f"127.0.0.1:{r.port}" for r in replicas)))


# ---- a streaming session ------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    """What one session saw: the replica that served it, the audio it heard and how it ended."""

    replica: str | None = None
    audio: bytearray = field(default_factory=bytearray)
    error: str | None = None
    """None when the utterance ended with ``done``; else what failed (the upgrade, or the stream)."""
    started: asyncio.Event = field(default_factory=asyncio.Event)
    """Set at the first audio frame."""


def sentences(index: int, count: int) -> list[str]:
    return [f"Stream {index} says sentence number {n}." for n in range(count)]


async def speak(url: str, index: int, count: int, pace_s: float, outcome: Outcome) -> Outcome:
    """One session, one utterance of ``count`` sentences sent ``pace_s`` apart (as a language model would write
    them), seed ``index``, 16-bit PCM; no retries, so a refused upgrade or a closed stream shows in ``outcome``."""
    try:
        connection = await Connection.open(url)
    except ClientError as exc:
        outcome.error = f"upgrade failed: {exc}"
        return outcome
    outcome.replica = connection.ws.response.headers.get(REPLICA_HEADER)
    # A long buffer delay: only whole sentences are spoken, whatever the pacing, so output equals a solo run's.
    start = Start(format="pcm_s16le", seed=index, max_buffer_delay_ms=60_000)

    async def send() -> None:
        for sentence in sentences(index, count):
            await connection.send(Text(sentence + " "))
            await asyncio.sleep(pace_s)
        await connection.send(End())

    async def receive() -> None:
        while True:
            message = await connection.receive()
            if isinstance(message, AudioFrame):
                outcome.audio += b"".join(message.packets)
                outcome.started.set()
            elif isinstance(message, Error):
                raise ClientError(f"error message {message.code}: {message.message}")
            elif isinstance(message, Done):
                if message.finish_reason not in ("stop", "length"):
                    raise ClientError(f"utterance finished with {message.finish_reason}")
                return

    async with connection:
        try:
            await connection.configure(start)
            sender = asyncio.ensure_future(send())
            try:
                await receive()
            finally:
                sender.cancel()
                await asyncio.gather(sender, return_exceptions=True)
        except ClientError as exc:
            outcome.error = f"stream failed: {exc}"
    return outcome
