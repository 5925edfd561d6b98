"""``SessionCore``: the rules of one WebSocket connection, sans I/O, whatever dialect its client speaks.

The asyncio driver (``session.py``) feeds it events (a client frame, a segment spoken or failed, an
utterance's last audio queued, its ``done`` sent, a deadline reached) with the time they happened,
and carries out the typed actions each event returns, in order. A client frame is read by the connection's
``Dialect`` into our typed messages (``ClientMessage``, ``protocol/wire.py``): our own protocol's frame is one
message (``OUR_PROTOCOL``); ElevenLabs' frames are translated (``elevenlabs_dialect.py``). ``handle`` takes one typed
message. The core owns:

* **Admission**: nothing is taken once closing or once the input ended; every frame spends the per-connection
  budget (``MessageBudget``; over it the connection is closed); a frame past ``max_message_bytes``, an
  unreadable one, and a message the state does not allow are refused with an ``error`` that
  changes nothing else.
* **Contexts** (``Context``): every client message addresses one, by its ``context_id`` (none: the
  default context, which always exists). A context has its own settings, text buffer, open
  utterance and cancel; a named one is made by the first ``start`` or ``text`` that names it (at
  most ``max_contexts`` at once) and forgotten on ``close_context``. Contexts speak side by side. How long a context
  lives is the dialect's ``ContextLife``: ours speaks utterance after utterance; ElevenLabs' speaks one and ends
  with it (``SendContextEnd``), and the end of the default context is the end of the input.
* **Text buffering** on an explicit clock, per context: complete sentences (``SentenceSegmenter``) are
  queued at once, and a ``(description)`` typed at an utterance's start becomes its voice design for
  every sentence (``Settings.design_prefix``); an incomplete rest is spoken on ``flush``, ``end``, or
  ``max_buffer_delay_ms`` after the first of its characters arrived. That delay is a deadline (``deadline``), reached
  through ``tick``; sentences without a letter or digit are not spoken (``sayable``).
* **The utterance lifecycle** (``UtteranceStatus``, ``SpeakingStep``): a context's utterances speak
  one after another, each one segment at a time, in order; ``cancel`` stops every live one of its
  context; each ends with one ``done`` and is released once that is sent.
* **Idleness**: a connection with no client message and no audio for ``idle_timeout_s`` is closed.
* **The end of the input** (``EndOfInput``, a dialect's ``close_socket``): nothing more is taken, and once every
  utterance is released the socket closes normally, after the output queued before (``SendClose``).

It knows no socket, task, engine or encoder: the driver speaks the segments, encodes the audio,
keeps the voice each segment continues, and writes the messages.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

from voxwire.finish_reason import FinishReason
from voxwire.protocol.error_codes import ErrorCode
from voxwire.protocol.wire import (
    Cancel,
    ClientMessage,
    CloseCode,
    CloseContext,
    End,
    Flush,
    ProtocolError,
    Start,
    Text,
    decode_client,
)
from voxwire.serving.ws.budget import MessageBudget
from voxwire.serving.ws.utterance import Settings, SpeakingStep, Utterance, UtteranceStatus
from voxwire.text.segmenter import SentenceSegmenter

MAX_CLOSE_REASON_BYTES = 123
"""RFC 6455 section 5.5: a close frame's reason fits in 123 bytes."""

CLIENT_GONE = "client_gone"
"""The reason a connection ended when the client left (not an ``ErrorCode``: nobody is told)."""


def sayable(text: str) -> bool:
    """Whether a sentence is spoken: the model has nothing to say for one without a letter or digit."""
    return any(char.isalnum() for char in text)


class SessionPhase(enum.Enum):
    """The connection's phase; whether an utterance takes text is that utterance's ``UtteranceStatus``."""

    ACTIVE = "active"
    """Messages are accepted, utterances spoken and sent."""
    ENDING = "ending"
    """The input ended (``EndOfInput``): nothing more is accepted; the live utterances are spoken and sent, then
    the socket closes normally."""
    CLOSED = "closed"
    """The connection is ending: nothing more is accepted, spoken or sent."""


class ContextLife(enum.Enum):
    """How long a context lives: a rule of the dialect (``Dialect.contexts``)."""

    MANY_UTTERANCES = "many_utterances"
    """Ours: a context speaks utterance after utterance until ``close_context`` forgets it."""
    ONE_UTTERANCE = "one_utterance"
    """ElevenLabs': a context speaks one utterance. Once that is ended, cancelled or failed (or the context is
    cancelled with none) it takes no more text (``invalid_message``), and once nothing of it is left to
    send it is over: ``SendContextEnd``, then a named context is forgotten and the default one's end is the end of
    the input (it is the connection's one context). Contexts are bounded as the utterances they are
    (``max_queued_utterances``, ``too_many_utterances``), not by ``max_contexts``."""


@dataclass(frozen=True, slots=True)
class EndOfInput:
    """The client will send nothing more (ElevenLabs' ``close_socket``): a dialect reads it after ending each
    context its way."""


Input = ClientMessage | EndOfInput
"""What a dialect reads a client frame as."""


@dataclass(frozen=True)
class SessionLimits:
    """The per-connection limits the core enforces (``ServerConfig`` fields of the same names)."""

    max_message_bytes: int
    max_messages_per_s: float
    max_text_chars_per_message: int
    max_text_chars_per_utterance: int
    max_queued_utterances: int
    idle_timeout_s: float
    max_contexts: int = 16
    """Named contexts at once (the default context not counted)."""


class Dialect(Protocol):
    """What a connection's client frames mean: how one reads as our messages, and how long a context lives."""

    @property
    def contexts(self) -> ContextLife: ...

    def read(self, data: str, core: SessionCore) -> Iterable[Input]:
        """The messages a text frame stands for. They are handled one by one as they are produced, so a lazy
        iterable may ask ``core`` how the ones before left it. Raises ``ProtocolError`` for a frame it cannot read
        (the messages produced before stay handled)."""
        ...


class OurProtocol:
    """Our own protocol: a frame is one JSON message (``decode_client``), and a context lives until it is closed."""

    contexts = ContextLife.MANY_UTTERANCES

    def read(self, data: str, core: SessionCore) -> tuple[ClientMessage]:
        return (decode_client(data),)


OUR_PROTOCOL = OurProtocol()


class UtteranceGate(Protocol):
    """The server's side of opening an utterance (``keys.ServerState`` fits)."""

    @property
    def accepting(self) -> bool:
        """Whether new utterances are taken now (not while starting or draining)."""
        ...

    def utterance(self) -> AbstractContextManager[None]:
        """Count one live utterance for as long as the context is open."""
        ...


# ---- actions: what the driver does, in the order given ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Announce:
    """Send a ``ready`` announcing ``settings`` of ``context_id``."""

    settings: Settings
    context_id: str | None = None


@dataclass(frozen=True, slots=True)
class Preload:
    """Load the text normalizer in the background, so the first normalized sentence need not wait for it."""


@dataclass(frozen=True, slots=True)
class SendError:
    """Send an ``error`` (``utterance``: the utterance it ended, if any; ``context_id``: the context of the message
    refused or of that utterance)."""

    code: ErrorCode
    message: str
    utterance: int | None = None
    context_id: str | None = None


@dataclass(frozen=True, slots=True)
class OpenUtterance:
    """A new utterance of ``context_id`` takes text from now on, spoken with ``settings``."""

    utterance: int
    settings: Settings
    context_id: str | None = None


@dataclass(frozen=True, slots=True)
class SpeakSegment:
    """Speak ``text`` as segment ``index`` of ``utterance`` on the service, designed by ``control`` (None: not
    designed); report ``segment_spoken`` or ``segment_failed``."""

    utterance: int
    index: int
    text: str
    control: str | None = None


@dataclass(frozen=True, slots=True)
class FinishAudio:
    """Queue the last audio of ``utterance``'s encoder; report ``audio_finished``."""

    utterance: int


@dataclass(frozen=True, slots=True)
class StopUtterance:
    """Stop ``utterance``'s work on the service and drop its output not sent yet."""

    utterance: int


@dataclass(frozen=True, slots=True)
class SendDone:
    """Queue ``utterance``'s ``done`` (built when its turn to be sent comes); report ``done_sent`` once sent."""

    utterance: int
    reason: FinishReason


@dataclass(frozen=True, slots=True)
class SendContextEnd:
    """Queue word that ``context_id`` is over (``ContextLife.ONE_UTTERANCE``: ElevenLabs' ``isFinal``)."""

    context_id: str | None


@dataclass(frozen=True, slots=True)
class SendClose:
    """Queue a normal close (1000) behind the output already queued: the input ended and nothing is left to say."""


@dataclass(frozen=True, slots=True)
class StopAll:
    """Stop every utterance's work and the connection's timers and tasks (the core has released them).
    ``dropped``: count the connection as dropped for this reason."""

    dropped: str | None


@dataclass(frozen=True, slots=True)
class CloseSocket:
    """Close the WebSocket with ``code`` and ``reason`` (already cut to fit a close frame)."""

    code: CloseCode
    reason: str


Action = (
    Announce | Preload | SendError | OpenUtterance | SpeakSegment | FinishAudio | StopUtterance | SendDone
    | SendContextEnd | SendClose | StopAll | CloseSocket
)  # fmt: skip


class Context:
    """One context of a connection: its settings, its text buffer and the deadline of that buffer."""

    def __init__(self, context_id: str | None, settings: Settings) -> None:
        self.id = context_id
        self.settings = settings
        """What the context's next utterance is spoken with (its latest ``start``)."""
        self.segmenter = SentenceSegmenter()
        self.flush_at: float | None = None
        """When the buffered rest of a sentence is spoken though incomplete; None: nothing waits for it."""
        self.started = False
        """A ``start`` set its settings (else they are the server's defaults)."""
        self.closed = False
        """``ContextLife.ONE_UTTERANCE``: its one utterance was ended, cancelled or failed; it takes no more text."""


class SessionCore:
    """One connection's rules. Every event method returns the actions to carry out, in order; it never raises for
    a client's mistake."""

    def __init__(
        self,
        limits: SessionLimits,
        resolve: Callable[[Start], Settings],
        gate: UtteranceGate,
        now: float,
        dialect: Dialect = OUR_PROTOCOL,
    ) -> None:
        """``resolve`` turns a ``start`` into ``Settings`` (raising ``ProtocolError`` to refuse it); ``now`` is
        when the connection opened, on the clock every later event uses; ``dialect`` reads the client's frames."""
        self.limits = limits
        self._resolve = resolve
        self._gate = gate
        self._dialect = dialect
        self._life = dialect.contexts
        self.phase = SessionPhase.ACTIVE
        self._defaults = resolve(Start())
        """The server's default settings, which a new context starts with."""
        self.contexts: dict[str | None, Context] = {None: Context(None, self._defaults)}
        """The contexts by id; None is the default context, which is never forgotten."""
        self.utterances: list[Utterance] = []
        """Utterances not ``RELEASED`` yet, oldest first; each one's ``status`` says where it is."""
        self._numbers = itertools.count()
        self._last_activity = now
        self._budget = MessageBudget(limits.max_messages_per_s, now)
        self._actions: list[Action] = []

    @property
    def settings(self) -> Settings:
        """What the default context's next utterance is spoken with."""
        return self.contexts[None].settings

    @property
    def deadline(self) -> float | None:
        """When the driver must call ``tick`` next (a buffer-delay flush, or the idle limit); None once closed."""
        if self.phase is SessionPhase.CLOSED:
            return None
        flushes = [context.flush_at for context in self.contexts.values() if context.flush_at is not None]
        return min([self._last_activity + self.limits.idle_timeout_s, *flushes])

    # ---- queries (for a dialect reading a frame) -------------------------------------------------------------------

    def started(self, context_id: str | None) -> bool:
        """Whether the context exists with the settings of a ``start`` it took."""
        context = self.contexts.get(context_id)
        return context is not None and context.started

    def open_utterance(self, context_id: str | None) -> bool:
        """Whether the context has an utterance taking text."""
        context = self.contexts.get(context_id)
        return context is not None and self._open(context) is not None

    # ---- events ------------------------------------------------------------------------------------------------

    def opened(self) -> list[Action]:
        """The connection is open: announce the settings."""
        self._emit(Announce(self.settings))
        return self._take()

    def receive(self, data: str, now: float) -> list[Action]:
        """A text frame: within ``max_message_bytes``, read by the dialect, its messages handled in order. A refusal
        is answered with an ``error`` and changes nothing else."""
        if self._admit(now):
            try:
                limit = self.limits.max_message_bytes
                if len(data.encode(errors="surrogatepass")) > limit:
                    raise ProtocolError(ErrorCode.MESSAGE_TOO_LARGE, f"messages are limited to {limit} bytes")
                for message in self._dialect.read(data, self):
                    self._take_message(message, now)
            except ProtocolError as exc:  # the frame is unreadable: nothing it stands for is known
                self._emit(SendError(exc.code, exc.message))
        return self._take()

    def handle(self, message: ClientMessage, now: float) -> list[Action]:
        """One typed message, of a frame already admitted (``receive`` spends the budget once per frame); a refusal
        is answered with an ``error`` and changes nothing else."""
        self._take_message(message, now)
        return self._take()

    def receive_binary(self, now: float) -> list[Action]:
        """A binary frame: clients never send one."""
        if self._admit(now):
            message = "clients send JSON text frames only; binary frames carry audio"
            self._emit(SendError(ErrorCode.BINARY_FRAME, message))
        return self._take()

    def tick(self, now: float) -> list[Action]:
        """Time passed: at ``deadline``, the idle limit closes the connection, or the buffered text is spoken."""
        if self.phase is SessionPhase.CLOSED:
            return []
        limit = self.limits.idle_timeout_s
        if now >= self._last_activity + limit:
            self._shut(CloseCode.IDLE_TIMEOUT, ErrorCode.IDLE_TIMEOUT.value, f"nothing sent or spoken for {limit:g} s")
        else:
            for context in list(self.contexts.values()):
                if context.flush_at is not None and now >= context.flush_at:
                    self._flush(context)
        return self._take()

    def audio_produced(self, now: float) -> None:
        """The service produced audio: the connection is not idle."""
        self._last_activity = now

    def segment_spoken(self, number: int, finish: FinishReason | None) -> list[Action]:
        """``SpeakSegment`` of ``number`` is over: the service ended it with ``finish``; None: normalization left
        nothing to say, so it was not sent to the service and takes no segment index."""
        if (utterance := self._find(number)) is not None:
            utterance.step = SpeakingStep.WAITING
            if finish is not None:
                utterance.spoken += 1
            if finish is FinishReason.LENGTH:
                utterance.reason = FinishReason.LENGTH
            self._advance()
        return self._take()

    def segment_failed(self, number: int, code: ErrorCode, message: str, now: float) -> list[Action]:
        """``SpeakSegment`` of ``number`` failed: the utterance ends in error, and its other sentences are dropped."""
        if (utterance := self._find(number)) is not None:
            self._emit(SendError(code, message, number, utterance.context_id))
            self._finish(utterance, FinishReason.ERROR, now)
            self._advance()
        return self._take()

    def audio_finished(self, number: int, now: float) -> list[Action]:
        """``FinishAudio`` of ``number`` is done: its ``done`` follows, and the next utterance may speak."""
        if (utterance := self._find(number)) is not None:
            self._finish(utterance, utterance.reason, now)
            self._advance()
        return self._take()

    def done_sent(self, number: int) -> list[Action]:
        """The socket took ``number``'s ``done``: the utterance is released (unless the session stopped first), and
        its context may be over with it (``ContextLife.ONE_UTTERANCE``)."""
        for utterance in self.utterances:
            if utterance.number == number:
                utterance.move(UtteranceStatus.RELEASED)
                self.utterances.remove(utterance)
                if (context := self.contexts.get(utterance.context_id)) is not None:
                    self._end_if_over(context)
                self._close_if_ended()
                break
        return self._take()

    def shut(self, code: CloseCode, reason: str, text: str) -> list[Action]:
        """End the connection now (the driver found the client slow or gone, or a bug): stop every utterance and
        close the socket with ``code``. ``reason`` (an ``ErrorCode`` value, or ``client_gone``) starts the
        close reason and labels the dropped-sessions metric."""
        self._shut(code, reason, text)
        return self._take()

    def disconnected(self) -> list[Action]:
        """The socket is gone: stop everything (counted as dropped when utterances were still being spoken)."""
        dropped = CLIENT_GONE if self._speaking() and self.phase is not SessionPhase.CLOSED else None
        self._stop(dropped)
        return self._take()

    # ---- client messages ---------------------------------------------------------------------------------------

    def _admit(self, now: float) -> bool:
        """Whether a client frame is handled: not once closing or ended, and not past the message budget (which
        closes)."""
        if self.phase is not SessionPhase.ACTIVE:
            return False
        if not self._budget.spend(now):
            limit = self.limits.max_messages_per_s
            self._shut(CloseCode.RATE_LIMITED, ErrorCode.RATE_LIMITED.value, f"more than {limit:g} messages per second")
            return False
        self._last_activity = now
        return True

    def _take_message(self, message: Input, now: float) -> None:
        """Handle one message, or answer its refusal; nothing is taken once the input ended."""
        if self.phase is not SessionPhase.ACTIVE:
            return
        try:
            self._handle(message, now)
        except ProtocolError as exc:
            context_id = None if isinstance(message, EndOfInput) else message.context_id
            self._emit(SendError(exc.code, exc.message, context_id=context_id))

    def _handle(self, message: Input, now: float) -> None:
        if isinstance(message, EndOfInput):
            self._end_input()
            return
        message.check()  # a dialect's messages keep our protocol's rules, as decoded ones do
        context = self.contexts.get(message.context_id)
        match message:
            case Start():
                self._start(context, message)
            case Text():
                self._text(context, message, now)
            case End():
                self._end(context)
            case Flush() if context is not None:
                self._flush(context)
            case Cancel() if context is not None:
                self._cancel(context, now)
            case CloseContext() if context is not None:
                self._cancel(context, now)
                self.contexts.pop(context.id, None)  # a context of one utterance may be over already
        # A flush, cancel or close_context of a context that does not exist has nothing to do.

    def _new_context(self, context_id: str | None) -> Context:
        """A named context with the server's default settings, within the limit (the default context always exists,
        so ``context_id`` is a name)."""
        if self._life is ContextLife.ONE_UTTERANCE:
            limit, code = self.limits.max_queued_utterances, ErrorCode.TOO_MANY_UTTERANCES
        else:
            limit, code = self.limits.max_contexts, ErrorCode.TOO_MANY_CONTEXTS
        if len(self.contexts) - 1 >= limit:
            raise ProtocolError(code, f"{limit} contexts of this connection are open; close_context one first")
        context = self.contexts[context_id] = Context(context_id, self._defaults)
        return context

    def _start(self, context: Context | None, start: Start) -> None:
        """A refused ``start`` makes no context."""
        if context is not None and self._open(context) is not None:
            raise ProtocolError(ErrorCode.UTTERANCE_IN_PROGRESS, "send end or cancel before changing settings")
        # The description goes in front of every sentence and is tokenized with it: bounded as a text message is.
        instructions, limit = start.instructions, self.limits.max_text_chars_per_message
        if instructions is not None and len(instructions) > limit:
            raise ProtocolError(ErrorCode.TEXT_TOO_LONG, f"start.instructions holds at most {limit} characters")
        settings = self._resolve(start)
        context = context or self._new_context(start.context_id)
        context.settings, context.started = settings, True
        if context.settings.normalize:
            self._emit(Preload())
        self._emit(Announce(context.settings, context.id))

    def _text(self, context: Context | None, message: Text, now: float) -> None:
        """A ``text`` refused for its length, or empty, makes no context."""
        text, limit = message.text, self.limits.max_text_chars_per_message
        if len(text) > limit:
            raise ProtocolError(ErrorCode.TEXT_TOO_LONG, f"a text message holds at most {limit} characters")
        if not text:
            return
        if context is not None and context.closed:
            raise ProtocolError(ErrorCode.INVALID_MESSAGE, "the context was closed; its text is not taken")
        context = context or self._new_context(message.context_id)
        utterance = self._open(context) or self._open_utterance(context)
        limit = self.limits.max_text_chars_per_utterance
        if utterance.chars + len(text) > limit:
            raise ProtocolError(ErrorCode.UTTERANCE_TOO_LONG, f"an utterance holds at most {limit} characters")
        utterance.chars += len(text)
        self._queue(context, utterance, context.segmenter.push(text))
        delay_ms = utterance.settings.max_buffer_delay_ms
        if delay_ms == 0 or not context.segmenter.pending.strip():
            self._flush(context)
        elif context.flush_at is None:
            context.flush_at = now + delay_ms / 1000

    def _flush(self, context: Context) -> None:
        context.flush_at = None
        if (utterance := self._open(context)) is not None:
            self._queue(context, utterance, context.segmenter.flush())

    def _end(self, context: Context | None) -> None:
        utterance = None if context is None else self._open(context)
        if context is not None:
            self._flush(context)
        if context is None or utterance is None or utterance.queued == 0:
            raise ProtocolError(ErrorCode.EMPTY_UTTERANCE, "end with nothing to speak: send text first")
        self._close_text(context)
        self._advance()

    def _cancel(self, context: Context, now: float) -> None:
        self._close_text(context)
        for utterance in self._speaking():
            if utterance.context_id == context.id:
                self._emit(StopUtterance(utterance.number))
                self._finish(utterance, FinishReason.CANCELLED, now)
        self._end_if_over(context)

    def _end_input(self) -> None:
        if self.phase is SessionPhase.ACTIVE:
            self.phase = SessionPhase.ENDING
        self._close_if_ended()

    def _open_utterance(self, context: Context) -> Utterance:
        if not self._gate.accepting:
            raise ProtocolError(ErrorCode.UNAVAILABLE, "the server is not taking new utterances now")
        limit = self.limits.max_queued_utterances
        if len(self._speaking()) >= limit:
            raise ProtocolError(
                ErrorCode.TOO_MANY_UTTERANCES, f"{limit} utterances of this connection are not done yet; wait for one"
            )
        utterance = Utterance(next(self._numbers), context.settings, context.id)
        context.segmenter = SentenceSegmenter(design_prefix=utterance.settings.design_prefix)
        utterance.live.enter_context(self._gate.utterance())
        self.utterances.append(utterance)
        self._emit(OpenUtterance(utterance.number, utterance.settings, context.id))
        return utterance

    def _close_text(self, context: Context) -> None:
        """The context's open utterance takes no more text (ended, cancelled or failed); drop what is buffered. A
        context of one utterance is closed with it."""
        context.flush_at = None
        context.segmenter = SentenceSegmenter()
        context.closed = self._life is ContextLife.ONE_UTTERANCE
        if (utterance := self._open(context)) is not None:
            utterance.move(UtteranceStatus.ENDED)

    def _queue(self, context: Context, utterance: Utterance, sentences: list[str]) -> None:
        if context.segmenter.control is not None:  # typed at the utterance's start: it replaces start's
            utterance.control = context.segmenter.control
        for sentence in filter(sayable, sentences):
            utterance.pending.append(sentence)
            utterance.queued += 1
        self._advance()

    # ---- the lifecycle -----------------------------------------------------------------------------------------

    def _advance(self) -> None:
        """Give each context's oldest live utterance its next step: its next sentence, or, once ended with every
        sentence spoken, its last audio. The utterances after it in its context wait their turn."""
        oldest: dict[str | None, Utterance] = {}
        for utterance in self._speaking():
            oldest.setdefault(utterance.context_id, utterance)
        for utterance in oldest.values():
            if utterance.step is not SpeakingStep.WAITING:
                continue
            if utterance.pending:
                utterance.step = SpeakingStep.SEGMENT
                sentence = utterance.pending.popleft()
                self._emit(SpeakSegment(utterance.number, utterance.spoken, sentence, utterance.control))
            elif utterance.status is UtteranceStatus.ENDED:
                utterance.step = SpeakingStep.TAIL
                self._emit(FinishAudio(utterance.number))

    def _finish(self, utterance: Utterance, reason: FinishReason, now: float) -> None:
        """The utterance is over: queue its ``done``; it stays counted live until that is sent."""
        if utterance.status is UtteranceStatus.OPEN and (context := self.contexts.get(utterance.context_id)):
            self._close_text(context)
        utterance.move(UtteranceStatus.FINISHED)
        self._last_activity = now
        self._emit(SendDone(utterance.number, reason))

    def _end_if_over(self, context: Context) -> None:
        """A closed context with nothing of it left to send is over (``ContextLife.ONE_UTTERANCE``)."""
        if not context.closed or any(utterance.context_id == context.id for utterance in self.utterances):
            return
        self._emit(SendContextEnd(context.id))
        if context.id is None:  # the connection's one context: the input ends with it
            self._end_input()
        else:
            del self.contexts[context.id]

    def _close_if_ended(self) -> None:
        """Once the input ended and every utterance is released, the socket closes after what is queued."""
        if self.phase is SessionPhase.ENDING and not self.utterances:
            self.phase = SessionPhase.CLOSED
            self._emit(SendClose())

    def _shut(self, code: CloseCode, reason: str, text: str) -> None:
        if self.phase is SessionPhase.CLOSED:
            return
        self._stop(reason)
        close_reason = f"{reason}: {text}".encode()[:MAX_CLOSE_REASON_BYTES].decode(errors="ignore")
        self._emit(CloseSocket(code, close_reason))

    def _stop(self, dropped: str | None) -> None:
        """Nothing more is accepted, spoken or sent: release every utterance."""
        self.phase = SessionPhase.CLOSED
        for context in self.contexts.values():
            context.flush_at = None
        for utterance in self.utterances:
            utterance.move(UtteranceStatus.RELEASED)
        self.utterances.clear()
        self._emit(StopAll(dropped))

    # ---- views -------------------------------------------------------------------------------------------------

    def _open(self, context: Context) -> Utterance | None:
        """The context's utterance taking text, if any."""
        return next(
            (u for u in self.utterances if u.status is UtteranceStatus.OPEN and u.context_id == context.id), None
        )

    def _speaking(self) -> list[Utterance]:
        """Utterances not finished yet (taking text or speaking), oldest first."""
        return [u for u in self.utterances if u.status in (UtteranceStatus.OPEN, UtteranceStatus.ENDED)]

    def _find(self, number: int) -> Utterance | None:
        """Utterance ``number`` if it is still speaking; a report about one cancelled or stopped meanwhile is moot."""
        return next((u for u in self._speaking() if u.number == number), None)

    def _emit(self, action: Action) -> None:
        self._actions.append(action)

    def _take(self) -> list[Action]:
        actions, self._actions = self._actions, []
        return actions
