"""The engine process's core (``EngineCore``) on its ZeroMQ socket, in a thread, on the simulated model: its step
messages follow ``EngineLoop``'s rule, as ``AsyncEngine``'s thread does (a stream's first chunk ahead of the
streams already playing)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from voxwire.engine import Engine, Request, SynthesisParams
from voxwire.serving.config import ServerConfig
from voxwire.serving.workers import ipc
from voxwire.serving.workers.engine_process import EngineCore
from voxwire.sim.model import SimSpeech


class Frontend:
    """A frontend's socket to one ``EngineCore``: send a message, receive the next one of a kind."""

    def __init__(self, endpoint: str) -> None:
        self.socket = zmq.Context.instance().socket(zmq.DEALER)
        self.socket.setsockopt(zmq.IDENTITY, ipc.frontend_identity(0))
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.connect(endpoint)
        self.send(ipc.Hello(1))
        self.receive(ipc.Welcome)

    def send(self, message: object) -> None:
        self.socket.send(ipc.dumps(message))

    def receive(self, kind: type, timeout_s: float = 10.0) -> object:
        """The next message of type ``kind`` (others in between are skipped)."""
        while self.socket.poll(int(timeout_s * 1000)):
            message = ipc.loads(self.socket.recv_multipart()[0])
            if isinstance(message, kind):
                return message
        raise AssertionError(f"no {kind.__name__} within {timeout_s} s")

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
    thread = threading.Thread(target=core.run, name="test-engine-core")
    thread.start()
    try:
        yield endpoint
    finally:
        core.stop()
        thread.join(timeout=30)


def test_a_new_streams_first_chunk_leads_its_step_message(endpoint: str) -> None:
    frontend = Frontend(endpoint)
    long = SynthesisParams(max_len=200)
    frontend.send(ipc.Add(Request("a", "A long utterance that keeps playing.", 8, long)))
    assert frontend.request_ids() == ["a"]
    frontend.send(ipc.Add(Request("b", "Another one.", 4, long)))
    while (ids := frontend.request_ids()) == ["a"]:
        pass
    assert ids == ["b", "a"]  # the engine's rows are a, b: b's first chunk goes first
    assert frontend.request_ids() == ["a", "b"]  # then the engine's order again
    frontend.socket.close()
