"""An engine process bounds the voice clips it encodes at once, from every frontend together (issue 20, item 4):
beyond ``max_voice_jobs`` a clip is refused at once as busy (503 with Retry-After at the frontend), instead of
queueing CPU work beside the step loop."""

from __future__ import annotations

import threading
import time

import numpy as np

from voxwire.engine import QueueFullError
from voxwire.prompt import VoicePrompt
from voxwire.serving.edge.api_errors import as_api_error
from voxwire.serving.workers import ipc
from voxwire.serving.workers.utility import UtilityCalls
from voxwire.sim.model import SimSpeech
from voxwire.voice_clip import VoiceClip


class GatedSpeech(SimSpeech):
    """The simulator, whose voice encoding waits for ``gate``."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()

    def make_prompt(self, clip: VoiceClip) -> VoicePrompt:
        self.gate.wait(10)
        return super().make_prompt(clip)


def _finished(calls: UtilityCalls, count: int) -> list[tuple[bytes, object]]:
    letters: list[tuple[bytes, object]] = []
    deadline = time.monotonic() + 10
    while len(letters) < count and time.monotonic() < deadline:
        letters += calls.finished()
        time.sleep(0.01)
    return letters


def test_encodings_beyond_the_bound_are_refused_as_busy_until_one_finishes() -> None:
    model = GatedSpeech()
    calls = UtilityCalls(model, None, max_voice_jobs=2)
    clip = VoiceClip("A clip.", np.zeros(16000, np.float32), 16000)
    try:
        assert calls.handle(b"frontend-0", ipc.EncodeVoice(1, clip)) == []
        assert calls.handle(b"frontend-1", ipc.EncodeVoice(2, clip)) == []
        [(sender, refused)] = calls.handle(b"frontend-0", ipc.EncodeVoice(3, clip))
        assert sender == b"frontend-0" and isinstance(refused, ipc.VoiceEncoded)
        assert isinstance(refused.error, QueueFullError)
        error = as_api_error(refused.error)
        assert error is not None
        assert (error.status, error.code.value, error.headers["Retry-After"]) == (503, "busy", "1")
        model.gate.set()
        done = _finished(calls, 2)
        assert sorted(message.call_id for _, message in done) == [1, 2]  # type: ignore[attr-defined]
        assert all(message.error is None for _, message in done)  # type: ignore[attr-defined]
        assert calls.handle(b"frontend-0", ipc.EncodeVoice(4, clip)) == []  # room again
        assert [message.call_id for _, message in _finished(calls, 1)] == [4]  # type: ignore[attr-defined]
    finally:
        calls.close()
