"""The engine process's core (``EngineCore``) on its ZeroMQ socket, in a thread, on the simulated model: its step
messages follow ``EngineLoop``'s rule, as ``AsyncEngine``'s thread does (a stream's first chunk ahead of the
streams already playing)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.engine_socket import FrontendSocket, running

from voxwire.engine import Engine, Request, SynthesisParams
from voxwire.serving.server_config import ServerConfig
from voxwire.serving.workers import ipc
from voxwire.serving.workers.engine_process import EngineCore
from voxwire.sim.model import SimSpeech


class Frontend(FrontendSocket):
    """Frontend 0, welcomed by the engine."""

    def __init__(self, endpoint: str) -> None:
        super().__init__(endpoint)
        self.send(ipc.Hello(1))
        self.receive(ipc.Welcome)

    def request_ids(self) -> list[str]:
        """The request ids of the next step's message, in the order the engine sent them."""
        outputs = self.receive(ipc.Outputs)
        assert isinstance(outputs, ipc.Outputs)
        return [row[0] for row in outputs.rows]


@pytest.fixture
def endpoint(tmp_path: Path) -> Iterator[str]:
    """An engine process's core on the simulated model, serving ``endpoint`` from a thread."""
    config = ServerConfig.of(model="sim", max_sessions=4, realtime=False, workers=0)
    model = SimSpeech()
    endpoint = f"ipc://{tmp_path}/engine-0"
    engine = Engine(model.new_runner(config.engine.runner_options()), config.engine.engine_config())
    core = EngineCore(model, engine, endpoint, max_voice_jobs=config.voices.max_voice_jobs)
    with running(core):
        yield endpoint


def test_a_new_streams_first_chunk_leads_its_step_message(endpoint: str) -> None:
    frontend = Frontend(endpoint)
    long = SynthesisParams(max_len=200)
    frontend.send(ipc.Add(Request("a", "A long utterance that keeps playing.", long)))
    assert frontend.request_ids() == ["a"]
    frontend.send(ipc.Add(Request("b", "Another one.", long)))
    while (ids := frontend.request_ids()) == ["a"]:
        pass
    assert ids == ["b", "a"]  # the engine's rows are a, b: b's first chunk goes first
    assert frontend.request_ids() == ["a", "b"]  # then the engine's order again
    frontend.socket.close()
