"""``voxwire serve --wyoming-port``: the start-up refusal without the operator's consent, and ``--workers``, where
every frontend serves the port."""

from __future__ import annotations

import asyncio
import re

import pytest
from tests.server_process import ServerProcess, poll
from wyoming.client import AsyncTcpClient
from wyoming.info import Describe, Info
from wyoming.tts import Synthesize

from voxwire.cli.main import main
from voxwire.serving.server_config import ServerConfig

LISTENING = re.compile(r"\[frontend-(\d+)\]: Wyoming listening on tcp://127\.0\.0\.1:(\d+)")


def test_a_non_loopback_wyoming_port_next_to_api_keys_needs_the_operators_consent(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["serve", "--host", "0.0.0.0", "--api-key", "k", "--wyoming-port", "10200"]) == 2
    assert "--wyoming-without-auth" in capsys.readouterr().err
    ServerConfig.of(host="0.0.0.0", api_keys=("k",), wyoming_port=10200, wyoming_without_auth=True)
    ServerConfig.of(host="127.0.0.1", api_keys=("k",), wyoming_port=10200)
    ServerConfig.of(host="0.0.0.0", no_auth=True, wyoming_port=10200)  # the HTTP API is as open as Wyoming


async def speak_over_wyoming(port: int) -> list[str]:
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(Describe().event())
        info_event = await asyncio.wait_for(client.read_event(), 60)
        assert info_event is not None
        assert Info.from_event(info_event).tts[0].supports_synthesize_streaming
        await client.write_event(Synthesize("Hello from a frontend.").event())
        types = []
        while not types or types[-1] not in ("audio-stop", "error"):
            event = await asyncio.wait_for(client.read_event(), 60)
            assert event is not None
            types.append(event.type)
        return types


@pytest.mark.slow
def test_every_frontend_of_workers_serves_the_wyoming_port() -> None:
    with ServerProcess("--model", "sim", "--workers", "2", "--wyoming-port", "0") as process:
        process.wait_ready()
        assert poll(lambda: len(set(LISTENING.findall(process.log))) == 2, timeout=60), process.log
        ports = {port for _, port in LISTENING.findall(process.log)}
        assert len(ports) == 1, f"the frontends share one port: {ports}"
        (port,) = ports
        for _ in range(4):  # the kernel spreads the connections over the frontends
            types = asyncio.run(speak_over_wyoming(int(port)))
            assert types[0] == "audio-start" and types[-1] == "audio-stop", types
