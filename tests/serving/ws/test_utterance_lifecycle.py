"""An utterance's lifecycle is one status that only moves forward: open, ended, finished, released."""

from __future__ import annotations

import pytest

from voxwire.protocol.wire import Done, End, Text, encode
from voxwire.serving.ws.utterance import Utterance, UtteranceStatus

from .conftest import ClipService, until
from .helpers import PATCH, RATE, MemoryTransport, new_session, noise


@pytest.mark.asyncio
async def test_an_utterance_moves_from_open_to_released_and_frees_the_servers_count() -> None:
    service = ClipService(noise(4), RATE, PATCH)
    transport = MemoryTransport()
    async with new_session(service, transport) as session:
        session.receive(encode(Text("Four patches.")))
        (utterance,) = session.core.utterances
        assert utterance.status is UtteranceStatus.OPEN and session.server.live_utterances == 1
        session.receive(encode(End()))
        assert utterance.status in (UtteranceStatus.ENDED, UtteranceStatus.FINISHED)
        await until(lambda: bool(transport.of(Done)))
        await until(lambda: utterance.status is UtteranceStatus.RELEASED)
        assert session.core.utterances == [] and session.server.live_utterances == 0
        with pytest.raises(RuntimeError, match="released -> open"):
            utterance.move(UtteranceStatus.OPEN)


def test_no_status_moves_backwards() -> None:
    order = list(UtteranceStatus)
    for status in order:
        utterance = Utterance.__new__(Utterance)  # only the status matters here
        utterance.number, utterance.status = 0, status
        for earlier in order[: order.index(status) + 1]:
            with pytest.raises(RuntimeError, match="no transition"):
                utterance.move(earlier)
