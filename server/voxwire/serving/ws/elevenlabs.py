"""The ElevenLabs-compatible WebSocket endpoints ``stream-input`` and ``multi-stream-input``.

ElevenLabs' clients (Pipecat's ``ElevenLabsTTSService``, LiveKit's ``elevenlabs.TTS``, its SDKs) speak
through this server with only their URL changed. The messages are ``elevenlabs_protocol.py``'s; this
module maps them onto the machinery of our own endpoint instead of repeating it:

* Each ElevenLabs context is spoken by a ``Session`` of its own (``session.py``; its ``SessionCore`` holds
  the rules: sentences spoken as soon as they are complete and an incomplete rest after
  ``max_buffer_delay_ms``, segments that continue the voice, cancel within one engine step, the limits,
  idleness). The context feeds it our protocol's messages: a ``start`` with the path's voice, the text
  as ``text``, ``flush`` as ``flush``, and ``close_context`` as ``end`` when everything sent was flushed
  (the rest is spoken, as the reference says a flushed context keeps flushing) or ``cancel`` when text came
  after the last flush (the client abandoned the turn: a barge-in; the engine stops within one step).
* The context is also that session's transport: what the session would send on our socket (``segment``,
  ``pcm_f32le`` frames at the model rate, ``done``, ``error``) it turns into ElevenLabs messages on the
  connection's socket: the audio re-encoded in the query's ``output_format``; once a sentence's audio is
  all out, its estimated character timings (``serving/alignment.py``) in a message without audio; ``isFinal``
  for the ``done``.

Connection-wide rules live in ``ElevenLabsConnection``: admission (503 before the upgrade, as on our
endpoint), the key (a header at the upgrade, else ``xi_api_key`` in the first message within ``key_timeout_s``,
else the socket is closed with 1008; until then the socket counts against ``max_keyless_connections``, not
``max_connections``, and once its key is accepted it must find a place there, else it is closed with 1013
``busy``), the per-connection message budget and size limit, at most ``max_queued_utterances``
live contexts, the idle limit while no context is live, and ``close_socket`` (or, on ``stream-input``, an
empty text): every context ends as ``close_context`` would end it, then the socket closes with 1000.
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

import numpy as np
from aiohttp import WSMsgType, web

from voxwire.finish_reason import FinishReason
from voxwire.protocol.error_codes import ErrorCode
from voxwire.protocol.wire import (
    MAX_SEED,
    AudioFrame,
    Cancel,
    ClientMessage,
    CloseCode,
    Done,
    End,
    Error,
    Flush,
    ProtocolError,
    Segment,
    Start,
    Text,
    decode_server,
    encode,
)
from voxwire.serving.alignment import SpeechMeter
from voxwire.serving.encoding import INLINE
from voxwire.serving.http.auth import key_in_first_message, key_matches
from voxwire.serving.http.errors import ApiError
from voxwire.serving.keys import (
    CONFIG_KEY,
    ENCODERS_KEY,
    ENGINES_KEY,
    METRICS_KEY,
    OWNER_KEY,
    STATE_KEY,
    TRACING_KEY,
    VOICES_KEY,
)
from voxwire.serving.voices import UnknownVoiceError
from voxwire.serving.ws.budget import MessageBudget
from voxwire.serving.ws.elevenlabs_protocol import (
    DEFAULT_CONTEXT_ID,
    DEFAULT_OUTPUT_FORMAT,
    MULTI_STREAM_INPUT_PATH,
    POLICY_VIOLATION,
    STREAM_INPUT_PATH,
    ElevenMessage,
    OutputFormat,
    alignment_message,
    audio_message,
    error_message,
    final_message,
    parse_client,
    parse_output_format,
)
from voxwire.serving.ws.handler import CountedSocket, close_and_cut, stream_socket, upgraded
from voxwire.serving.ws.session import Session
from voxwire.serving.ws.session_core import MAX_CLOSE_REASON_BYTES, sayable
from voxwire.serving.ws.utterance import UtteranceStatus

logger = logging.getLogger(__name__)

SESSION_FORMAT = "pcm_f32le"
"""What each context's session sends its context: the model's samples as they are, to re-encode and to time."""


def add_elevenlabs_routes(app: web.Application) -> None:
    app.router.add_get(STREAM_INPUT_PATH, stream_input)
    app.router.add_get(MULTI_STREAM_INPUT_PATH, multi_stream_input)


@key_in_first_message
async def stream_input(request: web.Request) -> web.WebSocketResponse:
    return await _serve(request, multi=False)


@key_in_first_message
async def multi_stream_input(request: web.Request) -> web.WebSocketResponse:
    return await _serve(request, multi=True)


@dataclass(frozen=True)
class Endpoint:
    """What the upgrade request asked for, checked before the upgrade."""

    multi: bool
    """``multi-stream-input``: contexts are named by ``context_id`` and messages carry ``contextId``."""
    voice: str
    output: OutputFormat
    seed: int | None
    context_times: bool
    """``sync_alignment=true``: alignment times count from the start of the context's audio, else from each
    sentence's (see ``elevenlabs_protocol.alignment_message``)."""
    authenticated: bool
    """The request carried a valid key (or the server needs none); else the first message must."""


def _endpoint(request: web.Request, multi: bool) -> Endpoint:
    """The endpoint's settings from the path and query. Raises ``ApiError`` (400/404) before the upgrade."""
    try:
        output = parse_output_format(request.query.get("output_format", DEFAULT_OUTPUT_FORMAT))
    except ValueError as exc:
        raise ApiError(ErrorCode.UNSUPPORTED_FORMAT, str(exc)) from None
    seed_text = request.query.get("seed")
    try:
        seed = None if seed_text is None else int(seed_text)
    except ValueError:
        raise ApiError(ErrorCode.INVALID_REQUEST, f"seed must be an integer, got {seed_text!r}") from None
    if seed is not None and not 0 <= seed < MAX_SEED:  # the context's start would be refused after the upgrade
        raise ApiError(ErrorCode.INVALID_REQUEST, f"seed must be in [0, 2**63), got {seed_text}")
    keys = request.app[CONFIG_KEY].transport.api_keys
    context_times = request.query.get("sync_alignment", "false").lower() == "true"
    authenticated = not keys or _key_sent(request)
    endpoint = Endpoint(multi, request.match_info["voice_id"], output, seed, context_times, authenticated)
    if endpoint.authenticated:  # an unauthenticated client learns nothing about the voices
        _check_voice(request.app, endpoint.voice)
    return endpoint


def _key_sent(request: web.Request) -> bool:
    """Whether the auth middleware checked a key (it lets a request without one through to this handler)."""
    return request.get(OWNER_KEY) is not None


def _check_voice(app: web.Application, voice: str) -> None:
    try:
        app[VOICES_KEY].resolve(voice)
    except UnknownVoiceError as exc:
        raise ApiError(ErrorCode.UNKNOWN_VOICE, str(exc)) from None


async def _serve(request: web.Request, *, multi: bool) -> web.WebSocketResponse:
    app = request.app
    config = app[CONFIG_KEY]
    endpoint = _endpoint(request, multi)
    keyless = not endpoint.authenticated
    ws = stream_socket(config)
    async with upgraded(request, ws, keyless=keyless) as counted:  # admitted (else 503 before the 101) and counted
        connection = ElevenLabsConnection(app, ws, request, endpoint, counted)
        try:
            async for message in ws:
                if message.type is WSMsgType.TEXT:
                    await connection.receive(message.data)
                elif message.type is WSMsgType.BINARY:
                    await connection.refuse(ErrorCode.BINARY_FRAME, "ElevenLabs messages are JSON text frames")
                await asyncio.sleep(0)  # take turns with the other connections, as our own endpoint does
        finally:
            await connection.disconnected()
    return ws


class ConnectionPhase(enum.Enum):
    OPEN = "open"
    """Messages are taken."""
    ENDING = "ending"
    """``close_socket`` (or end of input): the contexts finish, then the socket closes; nothing more is taken."""
    CLOSED = "closed"
    """The socket is closing or gone: nothing is taken or sent."""


class ElevenLabsConnection:
    """One socket of either endpoint: its contexts and the connection-wide rules (see the module docstring)."""

    def __init__(
        self,
        app: web.Application,
        ws: web.WebSocketResponse,
        request: web.Request,
        endpoint: Endpoint,
        counted: CountedSocket,
    ) -> None:
        self.app = app
        self.config = app[CONFIG_KEY]
        self.ws = ws
        self.transport = request.transport
        self.endpoint = endpoint
        self.service = app[ENGINES_KEY].pinned()  # a context's segments continue each other on one engine
        self.encoders = app.get(ENCODERS_KEY, INLINE)
        self.authenticated = endpoint.authenticated
        self.counted = counted
        self.phase = ConnectionPhase.OPEN
        self.contexts: dict[str | None, ElevenContext] = {}
        """Live contexts by id (None: ``stream-input``'s one context); a context leaves once its ``isFinal`` is sent."""
        now = time.monotonic()
        self._budget = MessageBudget(self.config.limits.max_messages_per_s, now)
        self._last_activity = now
        self._tasks: set[asyncio.Task[None]] = set()
        self._idle_watch = self._spawn(self._watch_idle())
        self._key_deadline = None if self.authenticated else self._spawn(self._await_key())

    # ---- client messages ---------------------------------------------------------------------------------------

    async def receive(self, data: str) -> None:
        if self.phase is not ConnectionPhase.OPEN:
            return
        now = time.monotonic()
        if not self._budget.spend(now):
            limit = self.config.limits.max_messages_per_s
            self.shut(CloseCode.RATE_LIMITED, ErrorCode.RATE_LIMITED, f"more than {limit:g} messages per second")
            return
        self._last_activity = now
        try:
            limit_bytes = self.config.limits.max_message_bytes
            if len(data.encode(errors="surrogatepass")) > limit_bytes:
                raise ProtocolError(ErrorCode.MESSAGE_TOO_LARGE, f"messages are limited to {limit_bytes} bytes")
            message = parse_client(data)
        except ProtocolError as exc:
            await self.refuse(exc.code, exc.message)
            return
        if not self.authenticated and not await self._authenticate(message):
            return
        await self._handle(message)

    async def _authenticate(self, message: ElevenMessage) -> bool:
        """The first message of a connection whose upgrade carried no key must carry a valid one."""
        if message.api_key is None or not key_matches(message.api_key, self.config.transport.api_keys):
            text = "an API key is required: send the xi-api-key header, or xi_api_key in the first message"
            text = text if message.api_key is None else "the API key is not valid"
            self.shut(POLICY_VIOLATION, ErrorCode.UNAUTHORIZED, text)
            return False
        if self._key_deadline is not None:
            self._key_deadline.cancel()
        if (refused := self.counted.authenticated()) is not None:  # the key came, but the server is full
            self.shut(CloseCode.TRY_AGAIN_LATER, refused.code, refused.message)
            return False
        self.authenticated = True
        try:
            _check_voice(self.app, self.endpoint.voice)
        except ApiError as exc:
            self.shut(POLICY_VIOLATION, exc.code, exc.message)
            return False
        return True

    async def _handle(self, message: ElevenMessage) -> None:
        multi = self.endpoint.multi
        if message.close_socket or (not multi and message.text == ""):
            await self._end_input()
            return
        context_id = (message.context_id or DEFAULT_CONTEXT_ID) if multi else None
        context = self.contexts.get(context_id)
        if context is None:
            opens = bool(message.text) and not message.close_context  # a keep-alive or close opens nothing
            if not opens:
                return
            limit = self.config.limits.max_queued_utterances
            if len(self.contexts) >= limit:
                text = f"{limit} contexts of this connection are live; close one first"
                await self.send(error_message(ErrorCode.TOO_MANY_UTTERANCES, text, context_id))
                return
            try:  # the voice may have been deleted since the upgrade; the session's start would be refused
                _check_voice(self.app, self.endpoint.voice)
            except ApiError as exc:
                await self.send(error_message(exc.code, exc.message, context_id))
                return
            context = self.contexts[context_id] = ElevenContext(self, context_id)
            await context.open()
        await context.take(message)

    async def _end_input(self) -> None:
        """``close_socket``: every context ends as ``close_context`` ends it; ``stream-input``'s end of input (an
        empty text): its context is spoken to its end, as a flush would. The socket closes after the last."""
        self.phase = ConnectionPhase.ENDING
        for context in list(self.contexts.values()):
            await context.close_context(flush=not self.endpoint.multi)
        if not self.contexts:
            self.close(CloseCode.NORMAL, "")

    async def refuse(self, code: ErrorCode, text: str) -> None:
        """A message that was not taken: said so, and nothing else changes; but on a connection still waiting for
        its key, the first message failed to carry it (refused messages must not keep a keyless socket open)."""
        if not self.authenticated:
            required = "an API key is required in the first message, which was refused"
            self.shut(POLICY_VIOLATION, ErrorCode.UNAUTHORIZED, f"{required} ({code.value}: {text})")
            return
        if (metrics := self.app.get(METRICS_KEY)) is not None:
            metrics.count_error(code.value)
        await self.send(error_message(code, text, None))

    # ---- from the contexts ------------------------------------------------------------------------------------

    async def send(self, body: dict[str, Any]) -> None:
        await self.ws.send_str(json.dumps(body, ensure_ascii=False, separators=(",", ":")))

    async def finished(self, context: ElevenContext) -> None:
        """``context`` sent its ``isFinal``: it leaves (its id may be used again), and its session stops."""
        if self.contexts.get(context.context_id) is context:
            del self.contexts[context.context_id]
        self._spawn(context.stop())
        if self.phase is ConnectionPhase.ENDING and not self.contexts:
            self.close(CloseCode.NORMAL, "")
        elif not self.endpoint.multi and self.phase is ConnectionPhase.OPEN:
            await self._end_input()  # stream-input has one context: once it is over, so is the socket

    def shut(self, code: int, error: ErrorCode, text: str) -> None:
        """End the connection now with ``code``; the close reason starts with ``error``'s value."""
        self.close(code, f"{error.value}: {text}")

    def close(self, code: int, reason: str) -> None:
        """Close the socket (in a task of the connection's own: a context's session may call this from its task,
        which stopping that session cancels). Nothing more is taken or sent."""
        if self.phase is ConnectionPhase.CLOSED:
            return
        self.phase = ConnectionPhase.CLOSED
        self._spawn(self._close(code, reason))

    async def _close(self, code: int, reason: str) -> None:
        message = reason.encode()[:MAX_CLOSE_REASON_BYTES].decode(errors="ignore").encode()  # whole characters
        await close_and_cut(self.ws, self.transport, code, message)

    async def disconnected(self) -> None:
        """The socket is gone: every context's session stops (its engine requests are aborted)."""
        self.phase = ConnectionPhase.CLOSED
        self._idle_watch.cancel()
        if self._key_deadline is not None:
            self._key_deadline.cancel()
        for context in list(self.contexts.values()):
            self._spawn(context.stop())
        self.contexts.clear()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # ---- background work --------------------------------------------------------------------------------------

    async def _watch_idle(self) -> None:
        """Close a connection with no live context and no message for ``idle_timeout_s`` (a live context's
        session watches its own idleness)."""
        limit = self.config.limits.idle_timeout_s
        while self.phase is not ConnectionPhase.CLOSED:
            await asyncio.sleep(max(0.0, self._last_activity + limit - time.monotonic()))
            if self.contexts:
                self._last_activity = time.monotonic()
            elif time.monotonic() >= self._last_activity + limit:
                self.shut(CloseCode.IDLE_TIMEOUT, ErrorCode.IDLE_TIMEOUT, f"nothing sent for {limit:g} s")

    async def _await_key(self) -> None:
        """Close a socket upgraded without a key that has not sent one within ``key_timeout_s`` (cancelled once the
        key is accepted): a silent one would otherwise hold its place until the idle limit."""
        limit = self.config.limits.key_timeout_s
        await asyncio.sleep(limit)
        text = f"no API key within {limit:g} s: send the xi-api-key header, or xi_api_key in the first message"
        self.shut(POLICY_VIOLATION, ErrorCode.UNAUTHORIZED, text)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            logger.error("ElevenLabs connection task failed", exc_info=exc)


class ContextState(enum.Enum):
    """Where a context is; it only moves forward."""

    OPEN = "open"
    """Taking text."""
    CLOSING = "closing"
    """Closed by the client: no more text; what was flushed is being spoken, then its ``isFinal``."""
    FINAL = "final"
    """Its ``isFinal`` was sent."""


class Flushed(enum.Enum):
    """Whether the text a context was sent has been flushed: what ``close_context`` does with it."""

    NOTHING_SENT = "nothing_sent"
    """No text to speak yet: closing has nothing to finish."""
    PENDING = "pending"
    """Text came after the last flush: closing now abandons the turn (a barge-in), so it is cancelled."""
    FLUSHED = "flushed"
    """Everything sent was flushed: closing lets it be spoken to its end."""


@dataclass
class _SentenceAudio:
    """A sentence being spoken: its text, and its audio so far measured for its timings (at the model rate)."""

    text: str
    spoken: str
    meter: SpeechMeter


class ElevenContext:
    """One context: a ``Session`` speaks it, and this is that session's transport (see the module docstring)."""

    def __init__(self, connection: ElevenLabsConnection, context_id: str | None) -> None:
        app = connection.app
        self.connection = connection
        self.context_id = context_id
        self.state = ContextState.OPEN
        self.flushed = Flushed.NOTHING_SENT
        self.opened = False
        """An utterance of the session took text (whitespace alone before any text only opens the context)."""
        self.model_rate = connection.service.info.sample_rate
        self.encoder = connection.endpoint.output.encoder(self.model_rate)
        self.session = Session(
            connection.service, connection.config, app[VOICES_KEY], app[STATE_KEY], self, app.get(METRICS_KEY),
            connection.encoders, tracing=app.get(TRACING_KEY),
        )  # fmt: skip
        self._sentence: _SentenceAudio | None = None
        self._sentence_start_s = 0.0
        """Where the sentence being spoken starts in the context's audio."""

    async def open(self) -> None:
        await self.session.__aenter__()
        endpoint = self.connection.endpoint
        self._tell(Start(voice=endpoint.voice, format=SESSION_FORMAT, seed=endpoint.seed))

    async def stop(self) -> None:
        """Stop the session: its engine requests are aborted and its tasks end."""
        await self.session.__aexit__(None, None, None)

    def _tell(self, message: ClientMessage) -> None:
        self.session.receive(encode(message))

    # ---- client messages -----------------------------------------------------------------------------------------

    async def take(self, message: ElevenMessage) -> None:
        text = message.text or ""
        if self.state is ContextState.OPEN:
            if text and (self.opened or text.strip()):
                self.opened = True
                self._tell(Text(text))
                if sayable(text):
                    self.flushed = Flushed.PENDING
            elif message.text == "":
                self._tell(Text(""))  # a keep-alive: the session's idle clock starts again, nothing else changes
            if message.flush:
                self._tell(Flush())
                if self.flushed is Flushed.PENDING:
                    self.flushed = Flushed.FLUSHED
        elif text.strip():  # the id names a new context only once this one's isFinal is out
            closed = f"context {self.context_id or DEFAULT_CONTEXT_ID!r} was closed; its text is not taken"
            await self.connection.send(error_message(ErrorCode.INVALID_MESSAGE, closed, self.context_id))
        if message.close_context:
            await self.close_context()

    async def close_context(self, *, flush: bool = False) -> None:
        """No more text: flushed text is spoken to its end, text after the last flush is dropped (see ``Flushed``);
        ``flush``: flush it first (everything is spoken). A context closed again while it is still speaking was
        abandoned (Pipecat closes a turn's context when its text ends, and again on a barge-in): it stops now."""
        if self.state is ContextState.CLOSING and not flush:
            self._tell(Cancel())
        if self.state is not ContextState.OPEN:
            return
        self.state = ContextState.CLOSING
        if flush and self.flushed is Flushed.PENDING:
            self.flushed = Flushed.FLUSHED
        if self.flushed is Flushed.FLUSHED:
            self._tell(End())
        core = self.session.core
        if any(utterance.status is UtteranceStatus.OPEN for utterance in core.utterances):
            self._tell(Cancel())  # text after the last flush, or nothing sayable for ``end`` to speak
        if not core.utterances:
            await self._final()  # nothing was taken (or all of it refused): no ``done`` will come

    # ---- the session's transport -------------------------------------------------------------------------------

    async def send_str(self, data: str) -> None:
        match decode_server(data):
            case Segment() as segment:
                await self._sentence_over()
                self._sentence = _SentenceAudio(segment.text, segment.spoken, SpeechMeter(self.model_rate))
            case Done() as done:
                await self._done(FinishReason(done.finish_reason))
            case Error() as error:
                await self.connection.send(error_message(error.code, error.message, self.context_id))
            case _:  # ``ready``: the settings are the endpoint's, known to the client already
                pass

    async def send_bytes(self, data: bytes) -> None:
        samples = np.frombuffer(b"".join(AudioFrame.decode(data).packets), dtype="<f4")
        if self._sentence is not None:
            self._sentence.meter.add(samples)
        await self._send_audio(await self.connection.encoders.encode(self.encoder, samples))

    async def close(self, code: CloseCode, reason: str) -> None:
        """The session ends the connection (idle, too many messages, a client too slow, a server bug): all of it,
        as on our own endpoint; ``reason`` already starts with its error code."""
        self.connection.close(code, reason)

    # ---- to the client -----------------------------------------------------------------------------------------

    async def _send_audio(self, blocks: list[bytes]) -> None:
        if blocks:
            await self.connection.send(audio_message(b"".join(blocks), self.context_id))

    async def _sentence_over(self, *, spoken: bool = True) -> None:
        """The sentence's audio is all out: send its timings (not for one cut short: they would be wrong)."""
        sentence, self._sentence = self._sentence, None
        if sentence is None or not sentence.meter.samples or not spoken:
            return
        written = sentence.meter.alignment(sentence.text)
        normalized = written if sentence.spoken == sentence.text else sentence.meter.alignment(sentence.spoken)
        offset = self._sentence_start_s if self.connection.endpoint.context_times else 0.0
        self._sentence_start_s += written.duration_s
        await self.connection.send(alignment_message(written, normalized, offset, self.context_id))

    async def _done(self, reason: FinishReason) -> None:
        await self._send_audio(await self.connection.encoders.finish(self.encoder))
        await self._sentence_over(spoken=reason is FinishReason.STOP)
        await self._final()

    async def _final(self) -> None:
        self.state = ContextState.FINAL
        await self.connection.send(final_message(self.context_id))
        await self.connection.finished(self)
