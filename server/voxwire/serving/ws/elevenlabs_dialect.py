"""``ElevenLabsDialect``: ElevenLabs' client messages read as ours, for the one ``SessionCore`` of a socket. Sans I/O.

Each ElevenLabs context is a context of the core (``stream-input``'s one context is the default context;
``multi-stream-input``'s are named by their ``context_id``) that speaks one utterance
(``ContextLife.ONE_UTTERANCE``: text after its close is refused, its end is ``isFinal``, and the end of
``stream-input``'s context ends the socket). A client message (``elevenlabs_protocol.ElevenMessage``) reads as:

* the first text of a context (``" "`` alone included): a ``start`` with the path's voice and seed, in
  ``pcm_f32le`` at the model's rate (the socket re-encodes it, ``elevenlabs.ElevenLabsSocket``); a voice deleted
  since the upgrade, or a context past the limit, is refused there and the rest of the message is not read;
* text: ``text`` (whitespace before a context's first words only opens it); ``flush: true``: ``flush``; an empty
  text on ``multi-stream-input``: nothing (the frame itself is the keep-alive: the idle clock starts again);
* ``close_context: true``: ``end`` when everything sent was flushed (the rest is spoken, as the reference says a
  flushed context keeps flushing), else ``cancel`` (text after the last flush: the client abandoned the turn, a
  barge-in; the engine stops within one step); a context closed a second time is cancelled (Pipecat closes a
  turn's context when its text ends, and again on a barge-in);
* ``close_socket: true``, or on ``stream-input`` an empty text (the end of input, where everything sent is
  flushed first): every context closed as ``close_context`` closes it, then ``EndOfInput``.

The budget, size limit, idleness, context limit and close are the core's, as on our own endpoint.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator

from voxwire.protocol.wire import Cancel, End, Flush, Start, Text
from voxwire.serving.ws.elevenlabs_protocol import DEFAULT_CONTEXT_ID, parse_client
from voxwire.serving.ws.session_core import ContextLife, EndOfInput, Input, SessionCore, sayable

SESSION_FORMAT = "pcm_f32le"
"""The format the core's contexts speak: the model's samples as they are, to re-encode and to count."""


class Turn(enum.Enum):
    """Where an ElevenLabs context's text is: what ``close_context`` does with it."""

    NOTHING_SENT = "nothing_sent"
    """No text to speak yet: closing has nothing to finish."""
    PENDING = "pending"
    """Text came after the last flush: closing now abandons the turn (a barge-in), so it is cancelled."""
    FLUSHED = "flushed"
    """Everything sent was flushed: closing lets it be spoken to its end."""
    CLOSED = "closed"
    """Closed by the client: what was flushed is being spoken; closing again cancels it."""


class ElevenLabsDialect:
    """One socket's reading of ElevenLabs' messages (see the module docstring)."""

    contexts = ContextLife.ONE_UTTERANCE

    def __init__(self, voice: str, seed: int | None, *, multi: bool) -> None:
        """``voice`` and ``seed``: the path's and the query's; ``multi``: ``multi-stream-input``."""
        self.voice = voice
        self.seed = seed
        self.multi = multi
        self._turns: dict[str | None, Turn] = {}
        """The contexts opened here by id (None: ``stream-input``'s); one the core no longer has is over."""

    def read(self, data: str, core: SessionCore) -> Iterator[Input]:
        """Our messages for one client frame, each produced after the core handled the one before (``Dialect``).
        Raises ``ProtocolError`` for a frame that is not an ElevenLabs message."""
        message = parse_client(data)
        if message.close_socket or (not self.multi and message.text == ""):
            for context_id in [context_id for context_id in self._turns if core.started(context_id)]:
                yield from self._close(context_id, core, flush=not self.multi)
            yield EndOfInput()
            return
        context_id = (message.context_id or DEFAULT_CONTEXT_ID) if self.multi else None
        text = message.text or ""
        if context_id not in self._turns or not core.started(context_id):
            if not text or message.close_context:  # a keep-alive or a close opens nothing
                return
            yield from self._open(context_id, core)
            if not core.started(context_id):  # refused: its text has no context to go to
                return
        if text and (text.strip() or core.open_utterance(context_id)):
            yield Text(text, context_id)
            if sayable(text) and self._turns[context_id] is not Turn.CLOSED:
                self._turns[context_id] = Turn.PENDING
        if message.flush:
            yield Flush(context_id)
            if self._turns[context_id] is Turn.PENDING:
                self._turns[context_id] = Turn.FLUSHED
        if message.close_context:
            yield from self._close(context_id, core, flush=False)

    def _open(self, context_id: str | None, core: SessionCore) -> Iterator[Input]:
        # The contexts that are over are forgotten here, so an id used again opens anew and the map stays small.
        self._turns = {known: turn for known, turn in self._turns.items() if core.started(known)}
        yield Start(voice=self.voice, format=SESSION_FORMAT, seed=self.seed, context_id=context_id)
        if core.started(context_id):
            self._turns[context_id] = Turn.NOTHING_SENT

    def _close(self, context_id: str | None, core: SessionCore, *, flush: bool) -> Iterator[Input]:
        """``close_context`` (``flush``: flushing what is pending first, at ``stream-input``'s end of input)."""
        turn, self._turns[context_id] = self._turns[context_id], Turn.CLOSED
        if turn is Turn.CLOSED:
            if not flush:
                yield Cancel(context_id)  # closed again while it speaks: abandoned
            return
        spoken_to_its_end = turn is Turn.FLUSHED or (flush and turn is Turn.PENDING)
        ending = spoken_to_its_end and core.open_utterance(context_id)
        if ending:
            yield End(context_id)
        if not ending or core.open_utterance(context_id):  # nothing to end, or nothing sayable for end to speak
            yield Cancel(context_id)
