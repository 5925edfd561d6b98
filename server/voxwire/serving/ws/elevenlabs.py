"""The ElevenLabs-compatible WebSocket endpoints ``stream-input`` and ``multi-stream-input``.

ElevenLabs' clients (Pipecat's ``ElevenLabsTTSService``, LiveKit's ``elevenlabs.TTS``, its SDKs) speak
through this server with only their URL changed. A socket of either is one ``Session`` of our own endpoint's
machinery (``session.py``; its ``SessionCore`` holds the rules: the budget, the size limit, idleness, the context
limit, sentences spoken as soon as they are complete and an incomplete rest after ``max_buffer_delay_ms``,
segments that continue the voice, cancel within one engine step, the close) spoken to in ElevenLabs' dialect.
This module is the translation at both ends and nothing else:

* in: ``ElevenLabsDialect`` (``elevenlabs_dialect.py``, sans I/O) reads ElevenLabs' messages
  (``elevenlabs_protocol.py``) as ours; a context of theirs is a context of the core that speaks one utterance;
* out: ``ElevenLabsSocket`` writes the session's typed events as ElevenLabs' messages: the audio (``pcm_f32le`` at
  the model's rate) re-encoded in the query's ``output_format``; once a sentence's audio is all out, its
  characters' timings from the session's word timings (``words``) in a message without audio; ``isFinal`` at the
  end of a context; ``error``s with the context's id;
* around them, the endpoint: admission (503 before the upgrade, as on our endpoint), and the key: a header at the
  upgrade, else ``xi_api_key`` (or ``"xi-api-key"``) in the first message within ``key_timeout_s``, else the socket
  is closed with 1008 (``FirstMessageKey``); until then the socket counts against ``max_keyless_connections``, not
  ``max_connections``, and once its key is accepted it must find a place there, else it is closed with 1013
  ``busy``.
"""

from __future__ import annotations

import asyncio
import enum
import json
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import numpy as np
from aiohttp import web

from voxwire.audio.elevenlabs_formats import DEFAULT_OUTPUT_FORMAT, OutputFormat, parse_output_format
from voxwire.audio.formats import StreamEncoder
from voxwire.finish_reason import FinishReason
from voxwire.protocol.error_codes import ErrorCode
from voxwire.protocol.wire import (
    MAX_SEED,
    Audio,
    AudioFrame,
    CloseCode,
    Done,
    Error,
    ProtocolError,
    Ready,
    Segment,
    ServerMessage,
    Words,
)
from voxwire.serving.edge.api_errors import ApiError
from voxwire.serving.edge.auth import key_in_first_message, key_matches
from voxwire.serving.runtime.encoding import INLINE, EncoderPool
from voxwire.serving.runtime.keys import (
    CONFIG_KEY,
    ENCODERS_KEY,
    ENGINES_KEY,
    METRICS_KEY,
    OWNER_KEY,
    STATE_KEY,
    TRACING_KEY,
    VOICES_KEY,
)
from voxwire.serving.speech.alignment import Alignment, WordTiming
from voxwire.serving.speech.voice_store import UnknownVoiceError
from voxwire.serving.ws.elevenlabs_dialect import ElevenLabsDialect
from voxwire.serving.ws.elevenlabs_protocol import (
    MULTI_STREAM_INPUT_PATH,
    STREAM_INPUT_PATH,
    alignment_message,
    audio_message,
    error_message,
    final_message,
    parse_client,
)
from voxwire.serving.ws.handler import CountedSocket, close_and_cut, receive_frames, stream_socket, upgraded
from voxwire.serving.ws.session import Session


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
    ws = stream_socket(config)
    async with upgraded(request, ws, keyless=not endpoint.authenticated) as counted:  # else 503 before the 101
        service = app[ENGINES_KEY].pinned()  # a context's segments continue each other on one engine
        encoders = app.get(ENCODERS_KEY, INLINE)
        socket = ElevenLabsSocket(ws, request.transport, endpoint, service.info.sample_rate, encoders)
        session = Session(
            service, config, app[VOICES_KEY], app[STATE_KEY], socket, app.get(METRICS_KEY), encoders,
            tracing=app.get(TRACING_KEY), dialect=ElevenLabsDialect(endpoint.voice, endpoint.seed, multi=multi),
        )  # fmt: skip
        async with session:
            if endpoint.authenticated:
                await receive_frames(ws, session)
            else:
                with FirstMessageKey(app, endpoint.voice, counted, session) as frames:
                    await receive_frames(ws, frames)
    return ws


class KeyState(enum.Enum):
    """Where a socket upgraded without a key is with it."""

    AWAITED = "awaited"
    """Its first message must carry it."""
    ACCEPTED = "accepted"
    """The first message carried a valid one: its frames go to the session."""
    REFUSED = "refused"
    """No valid key came (or no place among the connections): the socket is closing; nothing more is read."""


class FirstMessageKey:
    """The frames of a socket upgraded without a key, on their way to its session: the first must carry a valid key
    (``xi_api_key`` or ``"xi-api-key"``, or ``authorization: Bearer``) within ``key_timeout_s``, else the socket is
    closed with 1008 ``unauthorized`` (a first message refused as malformed included: refused messages must not keep
    a keyless socket open). Once the key is accepted the socket must find a place among the connections (else 1013
    ``busy``) and the path's voice must still exist (else 1008); then this frame and every later one go to the
    session."""

    def __init__(self, app: web.Application, voice: str, counted: CountedSocket, session: Session) -> None:
        self._app = app
        self._voice = voice
        self._counted = counted
        self._session = session
        self._keys = app[CONFIG_KEY].transport.api_keys
        self.state = KeyState.AWAITED
        limit = app[CONFIG_KEY].limits.key_timeout_s
        text = f"no API key within {limit:g} s: send the xi-api-key header, or xi_api_key in the first message"
        self._deadline = asyncio.get_running_loop().call_later(limit, self._refuse, CloseCode.POLICY_VIOLATION,
                                                                ErrorCode.UNAUTHORIZED.value, text)  # fmt: skip

    def __enter__(self) -> FirstMessageKey:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._deadline.cancel()

    def receive(self, data: str) -> None:
        if self.state is KeyState.AWAITED:
            try:
                self._check(parse_client(data).api_key)
            except ProtocolError as exc:
                self._refused_first(exc.code, exc.message)
        if self.state is KeyState.ACCEPTED:
            self._session.receive(data)

    def receive_binary(self) -> None:
        if self.state is KeyState.AWAITED:
            self._refused_first(ErrorCode.BINARY_FRAME, "ElevenLabs messages are JSON text frames")
        elif self.state is KeyState.ACCEPTED:
            self._session.receive_binary()

    def _check(self, key: str | None) -> None:
        if key is None or not key_matches(key, self._keys):
            text = "an API key is required: send the xi-api-key header, or xi_api_key in the first message"
            self._refuse(CloseCode.POLICY_VIOLATION, ErrorCode.UNAUTHORIZED.value,
                         text if key is None else "the API key is not valid")  # fmt: skip
            return
        self._deadline.cancel()
        if (refused := self._counted.authenticated()) is not None:  # the key came, but the server is full
            self._refuse(CloseCode.TRY_AGAIN_LATER, refused.code.value, refused.message)
            return
        try:
            _check_voice(self._app, self._voice)
        except ApiError as exc:
            self._refuse(CloseCode.POLICY_VIOLATION, exc.code.value, exc.message)
            return
        self.state = KeyState.ACCEPTED

    def _refused_first(self, code: ErrorCode, text: str) -> None:
        required = "an API key is required in the first message, which was refused"
        self._refuse(CloseCode.POLICY_VIOLATION, ErrorCode.UNAUTHORIZED.value, f"{required} ({code.value}: {text})")

    def _refuse(self, code: CloseCode, reason: str, text: str) -> None:
        self.state = KeyState.REFUSED
        self._session.shut(code, reason, text)


# ---- out: the session's events as ElevenLabs' messages -------------------------------------------------------------


@dataclass
class _Sentence:
    """A sentence being sent: its text, and its audio and words so far (times from its first sample)."""

    text: str
    start_s: float
    """Where it starts in its context's audio."""
    samples: int = 0
    words: list[WordTiming] = field(default_factory=list)


@dataclass
class _ContextAudio:
    """What a context's audio needs on its way out: its encoder and the sentence being sent."""

    encoder: StreamEncoder
    sentence: _Sentence | None = None


class ElevenLabsSocket:
    """A session's typed events as ElevenLabs' messages on an aiohttp WebSocket (``outbox.Transport``; see the module
    docstring). The session speaks ``elevenlabs_dialect.SESSION_FORMAT`` at ``model_rate``."""

    def __init__(
        self, ws: web.WebSocketResponse, transport: asyncio.Transport | None, endpoint: Endpoint, model_rate: int,
        encoders: EncoderPool,
    ) -> None:  # fmt: skip
        """``transport``: the request's, cut once the socket is closed (``handler.close_and_cut``)."""
        self.ws = ws
        self.transport = transport
        self.endpoint = endpoint
        self.model_rate = model_rate
        self.encoders = encoders
        self._contexts: dict[str | None, _ContextAudio] = {}
        """Each context with audio under way, until its end."""

    async def send(self, message: ServerMessage) -> None:
        match message:
            case Segment():
                audio = self._audio(message.context_id)
                await self._sentence_over(audio, message.context_id)
                audio.sentence = _Sentence(message.text, message.start_sample / self.model_rate)
            case Words():
                sentence = self._audio(message.context_id).sentence
                assert sentence is not None, "a segment's words follow its segment"
                times = zip(message.words, message.starts_s, message.ends_s, strict=True)
                sentence.words += [WordTiming(word, a - sentence.start_s, b - sentence.start_s) for word, a, b in times]
            case Done():
                audio = self._audio(message.context_id)
                await self._send_audio(await self.encoders.finish(audio.encoder), message.context_id)
                spoken = message.finish_reason == FinishReason.STOP.value
                await self._sentence_over(audio, message.context_id, spoken=spoken)
            case Error():
                await self._send(error_message(message.code, message.message, message.context_id))
            case Ready() | Audio():  # ready: the settings are the endpoint's, known to the client; audio comes framed
                pass

    async def send_frame(self, frame: AudioFrame, audio_transport: str) -> None:
        samples = np.frombuffer(b"".join(frame.packets), dtype="<f4")
        audio = self._audio(frame.context_id)
        if audio.sentence is not None:
            audio.sentence.samples += samples.size
        await self._send_audio(await self.encoders.encode(audio.encoder, samples), frame.context_id)

    async def end_context(self, context_id: str | None) -> None:
        self._contexts.pop(context_id, None)
        await self._send(final_message(context_id))

    async def close(self, code: CloseCode, reason: str) -> None:
        await close_and_cut(self.ws, self.transport, code, reason.encode())

    def _audio(self, context_id: str | None) -> _ContextAudio:
        if (audio := self._contexts.get(context_id)) is None:
            audio = self._contexts[context_id] = _ContextAudio(self.endpoint.output.encoder(self.model_rate))
        return audio

    async def _send_audio(self, blocks: list[bytes], context_id: str | None) -> None:
        if blocks:
            await self._send(audio_message(b"".join(blocks), context_id))

    async def _sentence_over(self, audio: _ContextAudio, context_id: str | None, *, spoken: bool = True) -> None:
        """The sentence's audio is all out: send its timings (not for one cut short: they would be wrong)."""
        sentence, audio.sentence = audio.sentence, None
        if sentence is None or not sentence.samples or not spoken:
            return
        alignment = Alignment.of_words(sentence.text, sentence.words, sentence.samples / self.model_rate)
        offset_s = sentence.start_s if self.endpoint.context_times else 0.0
        await self._send(alignment_message(alignment, offset_s, context_id))

    async def _send(self, body: dict[str, Any]) -> None:
        await self.ws.send_str(json.dumps(body, ensure_ascii=False, separators=(",", ":")))
