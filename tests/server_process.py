"""``voxwire serve`` as a child process, for tests of the command as operators run it."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from types import TracebackType

SERVER_THREADS = 1
"""Torch threads of every server process these tests start (``OMP_NUM_THREADS``)."""


@contextlib.contextmanager
def server_threads() -> Iterator[None]:
    """Run this process's torch with a server process's thread count, to compute the audio a server should
    send: float32 results may depend on the thread count (they do on an AVX2 EPYC, at 1 and 2 threads)."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(SERVER_THREADS)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


class ServerProcess:
    """``voxwire serve <args> --port 0``; ``url`` once it listens; stderr is kept in ``log``.

    ``launcher`` runs before the command and must exec it (e.g. ``unshare``), so ``process`` is the server.

    Unless a test asks otherwise, the server does not refuse streams ``busy`` for the engine's step time
    (``--max-step-load 1000``): the suite runs tests in parallel, so a step here is as slow as the machine is busy,
    and these tests are about other things (tests/engine/test_shedding.py, tests/serving/ws/test_overload.py and
    tests/workers/test_oversubscribed.py hold the overload rule)."""

    def __init__(self, *args: str, env: dict[str, str] | None = None, launcher: Sequence[str] = ()) -> None:
        single = () if "--workers" in args else ("--workers", "0")  # one process unless a test asks for workers
        unshed = () if "--max-step-load" in args else ("--max-step-load", "1000")
        command = [*launcher, sys.executable, "-m", "voxwire.cli.main", "serve", *single, *unshed, *args, "--port", "0"]
        environment = {**os.environ, "OMP_NUM_THREADS": str(SERVER_THREADS), **(env or {})}
        self.process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=environment)
        self._lines: list[str] = []
        self.url = self._listening_url()
        self._reader = threading.Thread(target=self._read_log, daemon=True)
        self._reader.start()

    @property
    def ws_url(self) -> str:
        return self.url.replace("http://", "ws://") + "/v1/tts/stream"

    @property
    def log(self) -> str:
        return "".join(self._lines)

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.process.kill()
        self.process.wait(timeout=30)

    def status(self, path: str, token: str | None = None) -> int | None:
        return http_status(self.url + path, token)

    def get(self, path: str, token: str | None = None) -> str:
        request = urllib.request.Request(self.url + path, headers={"Authorization": f"Bearer {token}"} if token else {})
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.read().decode()

    def wait_ready(self, timeout: float = 60.0, probes: int = 8) -> None:
        """Until ``probes`` fresh connections in a row find it ready (with ``--workers``, every frontend is then
        ready but for odds of 2**-probes, its warm-up done)."""
        streak = 0

        def ready() -> bool:
            nonlocal streak
            streak = streak + 1 if self.status("/ready") == 200 else 0
            return streak >= probes

        assert poll(ready, timeout, interval=0.05), f"never became ready:\n{self.log}"

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM, then the exit status."""
        self.process.terminate()
        returncode = self.process.wait(timeout=timeout)
        self._reader.join(timeout=5)
        return returncode

    def _listening_url(self) -> str:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self._lines.append(line)
            found = re.search(r"listening on (https?://\S+)", line)
            if found:
                return found.group(1)
        raise AssertionError("the server exited before listening:\n" + self.log)

    def _read_log(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self._lines.append(line)


def http_status(url: str, token: str | None = None) -> int | None:
    """The HTTP status of a GET (an error status included), or None when nothing answers."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return None


def poll(condition: Callable[[], bool], timeout: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return False
