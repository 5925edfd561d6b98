"""``--local``: a throwaway ``voxwire serve`` subprocess on a given or free port, ready before the run, stopped
after."""

from __future__ import annotations

import asyncio
import socket
import sys
import tempfile
import time
import urllib.error
import urllib.request
from types import TracebackType

from voxwire.client.errors import ServerUnreachableError

READY_TIMEOUT_S = 600.0
"""Loading a real checkpoint and warming it up can take minutes; the demo model takes seconds."""
STOP_TIMEOUT_S = 30.0


class LocalServer:
    """``async with LocalServer(model, args) as url``: the server's ``ws://`` URL once ``/ready`` answers 200."""

    def __init__(self, model: str = "demo", extra_args: tuple[str, ...] = (), port: int = 0) -> None:
        """``port`` 0: any free port."""
        self.model = model
        self.extra_args = extra_args
        self.port = port or _free_port()
        self._log = tempfile.TemporaryFile()  # noqa: SIM115  # closed in __aexit__
        self._process: asyncio.subprocess.Process | None = None

    async def __aenter__(self) -> str:
        command = [sys.executable, "-m", "voxwire.cli.main", "serve", "--model", self.model]
        command += ["--host", "127.0.0.1", "--port", str(self.port), *self.extra_args]
        self._process = await asyncio.create_subprocess_exec(*command, stdout=self._log, stderr=self._log)
        try:
            await self._wait_ready()
        except BaseException:
            await self._stop()
            raise
        return f"ws://127.0.0.1:{self.port}"

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._stop()

    async def _wait_ready(self) -> None:
        assert self._process is not None
        deadline = time.monotonic() + READY_TIMEOUT_S
        url = f"http://127.0.0.1:{self.port}/ready"
        while time.monotonic() < deadline:
            if self._process.returncode is not None:
                raise ServerUnreachableError(f"the local server exited ({self._process.returncode}):\n{self._tail()}")
            if await asyncio.to_thread(_is_ready, url):
                return
            await asyncio.sleep(0.2)
        raise ServerUnreachableError(f"the local server was not ready within {READY_TIMEOUT_S:.0f} s:\n{self._tail()}")

    async def _stop(self) -> None:
        process = self._process
        if process is not None and process.returncode is None:
            process.terminate()  # SIGTERM: the server drains and exits
            try:
                await asyncio.wait_for(process.wait(), STOP_TIMEOUT_S)
            except asyncio.TimeoutError:
                process.kill()
                await process.wait()
        self._log.close()

    def _tail(self, lines: int = 20) -> str:
        self._log.seek(0)
        return "\n".join(self._log.read().decode(errors="replace").splitlines()[-lines:])


def _is_ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port
