"""An engine process's core (``EngineCore``) run in a thread, and a test's socket to it as frontend 0: the engine
side of the IPC is driven in-process, with no process spawned."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import zmq

from voxwire.serving.workers import ipc
from voxwire.serving.workers.engine_process import EngineCore


class FrontendSocket:
    """Frontend 0's DEALER socket to one ``EngineCore``: send a message, receive the next one of a kind."""

    def __init__(self, endpoint: str) -> None:
        self.socket = zmq.Context.instance().socket(zmq.DEALER)
        self.socket.setsockopt(zmq.IDENTITY, ipc.frontend_identity(0))
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.connect(endpoint)

    def send(self, message: object) -> None:
        self.socket.send(ipc.dumps(message))

    def receive(self, kind: type, timeout_s: float = 30.0) -> object:
        """The next message of type ``kind`` (heartbeats, step outputs and others in between are skipped)."""
        while self.socket.poll(int(timeout_s * 1000)):
            message = ipc.loads(self.socket.recv_multipart()[0])
            if isinstance(message, kind):
                return message
        raise AssertionError(f"no {kind.__name__} within {timeout_s} s")

    def close(self) -> None:
        self.socket.close()


@contextmanager
def running(core: EngineCore) -> Iterator[None]:
    """``core`` serving its socket from a thread until the block ends."""
    thread = threading.Thread(target=core.run, name="test-engine-core")
    thread.start()
    try:
        yield
    finally:
        core.stop()
        thread.join(timeout=30)
