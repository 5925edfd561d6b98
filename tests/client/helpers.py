"""Run the ``voxwire`` command line in a subprocess from a test whose event loop serves the in-process app."""

from __future__ import annotations

import asyncio
import socket
import sys
from dataclasses import dataclass

TIMEOUT_S = 120.0
"""Generous: two CPU cores are shared with other test runs, and a fresh interpreter imports numpy."""


@dataclass(frozen=True)
class Completed:
    returncode: int
    stdout: bytes
    stderr: str


async def voxwire(*args: str, stdin: bytes | None = None, env: dict[str, str] | None = None) -> Completed:
    """``voxwire ARGS`` to completion (asynchronously, so the server in this process keeps answering)."""
    process = await launch(*args, env=env)
    stdout, stderr = await asyncio.wait_for(process.communicate(stdin), TIMEOUT_S)
    assert process.returncode is not None
    return Completed(process.returncode, stdout, stderr.decode())


async def launch(*args: str, env: dict[str, str] | None = None) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "voxwire.cli.main",
        *args,
        env=env,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


def free_port() -> int:
    """A port nothing listens on (for now)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port
