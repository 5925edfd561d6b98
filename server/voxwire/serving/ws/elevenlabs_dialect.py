"""``ElevenLabsDialect``: ElevenLabs' client messages read as ours, for the one ``SessionCore`` of a socket. Sans I/O.

Each ElevenLabs context is a context of the core (``stream-input``'s one context is the default context;
``multi-stream-input``'s are named by their ``context_id``) that speaks one utterance
(``ContextLife.ONE_UTTERANCE``: text after its close is refused, its end is ``isFinal``, and the end of
``stream-input``'s context ends the socket). A client message (``elevenlabs_protocol.ElevenMessage``) reads as:

* the first text of a context (``" "`` alone included): a ``start`` with the path's voice and seed and the
  message's ``voice_settings.speed`` (the tempo our ``start.speed`` gives; ``voice_settings`` on a later message of
  the context is checked but changes nothing, as the reference has it only on the first), in ``pcm_f32le`` at the
  model's rate (the socket re-encodes it, ``elevenlabs.ElevenLabsSocket``); a voice deleted since the upgrade, or a
  context past the limit, is refused there and the rest of the message is not read;
* text: ``text`` (whitespace before a context's first words only opens it); ``flush: true``: ``flush``; an empty
  text on ``multi-stream-input``: nothing (the frame itself is the keep-alive: the idle clock starts again);
* ``close_context: true``: ``end`` when the client marked the end of the turn's text, a flush that brings no text
  of its own after the last text (``{"flush": true}``, ``{"text": "", "flush": true}``: how Pipecat and LiveKit end
  a turn before they close its context; the reference says a context set to flush keeps flushing); else ``cancel``:
  the client abandoned the turn, a barge-in, and whatever of it is not spoken yet is dropped, sentences already
  flushed with their text included (LiveKit sends each sentence with ``flush: true`` and closes the context when
  the user barges in), and the engine stops within one step; a context closed a second time is cancelled
  (Pipecat closes a turn's context when its text ends, and again on a barge-in);
* ``close_socket: true``: every context whose text is all flushed is spoken to its end (as the reference says
  for ``close_socket``), the others cancelled, then ``EndOfInput``; on ``stream-input`` an empty text is the end of
  input: everything sent is flushed and spoken, then the socket closes. A socket that closes (or breaks) stops
  everything within one engine step (``SessionCore.disconnected``).

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
    """Where an ElevenLabs context's text is: what ``close_context`` and ``close_socket`` do with it."""

    NOTHING_SENT = "nothing_sent"
    """No text to speak yet: closing has nothing to finish."""
    PENDING = "pending"
    """Text came after the last flush: closing abandons the turn (a barge-in), so it is cancelled."""
    FLUSHED = "flushed"
    """Everything sent was flushed, the last flush with text of its own (a sentence flushed as it was sent): the
    turn's end is not known, so ``close_context`` cancels it (a barge-in); ``close_socket`` lets it be spoken."""
    ENDED = "ended"
    """A flush without text came after the last text, the end of the turn: closing lets it be spoken to its end."""
    CLOSED = "closed"
    """Closed by the client: what was flushed is being spoken; closing again cancels it."""


_SPOKEN_ON_CLOSE_CONTEXT = frozenset({Turn.ENDED})
_SPOKEN_ON_CLOSE_SOCKET = frozenset({Turn.FLUSHED, Turn.ENDED})


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
            end_of_input = not self.multi and not message.close_socket
            for context_id in [context_id for context_id in self._turns if core.started(context_id)]:
                yield from self._close(context_id, core, _SPOKEN_ON_CLOSE_SOCKET, end_of_input=end_of_input)
            yield EndOfInput()
            return
        context_id = (message.context_id or DEFAULT_CONTEXT_ID) if self.multi else None
        text = message.text or ""
        if context_id not in self._turns or not core.started(context_id):
            if not text or message.close_context:  # a keep-alive or a close opens nothing
                return
            yield from self._open(context_id, core, message.speed)
            if not core.started(context_id):  # refused: its text has no context to go to
                return
        if text and (text.strip() or core.open_utterance(context_id)):
            yield Text(text, context_id)
            if sayable(text) and self._turns[context_id] is not Turn.CLOSED:
                self._turns[context_id] = Turn.PENDING
        if message.flush:
            yield Flush(context_id)
            if self._turns[context_id] in (Turn.PENDING, Turn.FLUSHED):
                self._turns[context_id] = Turn.FLUSHED if sayable(text) else Turn.ENDED
        if message.close_context:
            yield from self._close(context_id, core, _SPOKEN_ON_CLOSE_CONTEXT)

    def _open(self, context_id: str | None, core: SessionCore, speed: float | None) -> Iterator[Input]:
        # The contexts that are over are forgotten here, so an id used again opens anew and the map stays small.
        self._turns = {known: turn for known, turn in self._turns.items() if core.started(known)}
        yield Start(voice=self.voice, format=SESSION_FORMAT, seed=self.seed, speed=speed, context_id=context_id)
        if core.started(context_id):
            self._turns[context_id] = Turn.NOTHING_SENT

    def _close(
        self, context_id: str | None, core: SessionCore, spoken: frozenset[Turn], *, end_of_input: bool = False
    ) -> Iterator[Input]:
        """Close a context: spoken to its end when its ``Turn`` is one of ``spoken``, else cancelled
        (``end_of_input``: ``stream-input``'s empty text, which flushes what is pending first)."""
        turn, self._turns[context_id] = self._turns[context_id], Turn.CLOSED
        if turn is Turn.CLOSED:
            if not end_of_input:
                yield Cancel(context_id)  # closed again while it speaks: abandoned
            return
        spoken_to_its_end = turn in spoken or (end_of_input and turn is Turn.PENDING)
        ending = spoken_to_its_end and core.open_utterance(context_id)
        if ending:
            yield End(context_id)
        if not ending or core.open_utterance(context_id):  # nothing to end, or nothing sayable for end to speak
            yield Cancel(context_id)
