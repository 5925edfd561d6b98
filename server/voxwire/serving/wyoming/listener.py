"""The Wyoming listener: an asyncio TCP server beside the app's HTTP one, on ``--host`` and ``--wyoming-port``.

Each connection is a ``WyomingCore`` (the rules, ``protocol.py``) fed with the bytes read and ``time.monotonic()``;
its actions are carried out in order by one task of the connection, so that the audio of one request never
interleaves with another answer. Speaking goes the HTTP routes' way: the app's admission (``not_ready``,
``shutting_down``, ``busy``, ``engine_restarted``: an ``error`` event), the ``Speaker``, the live-utterance count that
shutdown waits for, and the same metrics. A stream's sentences after its first continue the voice of the sentence
before (as on the WebSocket), so the default voice stays one speaker through a stream.

Writes wait at most ``--write-timeout-s`` for a client that stopped reading, then the connection is aborted: a slow
client holds its own connection's task only, never another's. Connections beyond ``--max-wyoming-connections`` (per
process) get an ``error`` ``busy`` and are closed.

Wyoming has no authentication: the listener is for a trusted network (``Transport`` refuses a non-loopback one next
to API keys unless ``--wyoming-without-auth``). Under ``--workers`` every frontend listens on the port
(``SO_REUSEPORT``, the supervisor reserves it), each once warmed up, as for the HTTP port.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator

from aiohttp import web

from voxwire import __version__
from voxwire.audio.formats import AudioFormat, make_encoder
from voxwire.chunk import Patch
from voxwire.engine import FinishReason, SynthesisParams
from voxwire.errors import InvalidInputError
from voxwire.prompt import VoicePrompt
from voxwire.protocol.error_codes import ErrorCode
from voxwire.serving.edge.admission import refusal
from voxwire.serving.runtime.keys import (
    CONFIG_KEY,
    ENCODERS_KEY,
    METRICS_KEY,
    SPEAKER_KEY,
    STATE_KEY,
    VOICES_KEY,
    OneProcess,
)
from voxwire.serving.runtime.timeouts import within
from voxwire.serving.speech.persona_names import client_owner
from voxwire.serving.speech.service import SpeechFailure, SpeechJob, UtteranceOptions
from voxwire.serving.speech.voice_design import OPENAI_VOICE_DESIGNS, utterance_control
from voxwire.serving.speech.voice_store import OPENAI_VOICES, UnknownVoiceError
from voxwire.serving.ws.utterance import next_prompt
from voxwire.serving.wyoming.protocol import (
    SAMPLE_WIDTH,
    Action,
    Close,
    EndStream,
    Send,
    SendInfo,
    Speak,
    SpeechPart,
    VoiceEntry,
    WyomingCore,
    WyomingEvent,
    WyomingLimits,
    encode_event,
    error_event,
    info_event,
)
from voxwire.text.design import designed_text

logger = logging.getLogger(__name__)

READ_BYTES = 64 * 1024
"""The most read from a connection at once."""
QUEUED_ACTIONS = 64
"""Actions of one connection waiting for its task; past them the connection is not read (TCP pushes back)."""
_READY_POLL_S = 0.05


class ClientGone(Exception):
    """The client left, or stopped reading for ``--write-timeout-s``: the connection is over."""


class WyomingListener:
    """The app's Wyoming TCP server (``add_wyoming_listener``); ``port`` once it listens."""

    def __init__(self, app: web.Application) -> None:
        self.app = app
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        """Every connection's task, until its socket is closed."""
        self._serving = 0
        """Connections served now (``--max-wyoming-connections``), those being closed or refused aside."""
        self._closing = False

    @property
    def port(self) -> int | None:
        """The port it listens on (``--wyoming-port 0`` picks one); None before it listens."""
        if self._server is None or not self._server.sockets:
            return None
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self, *, reuse_port: bool) -> None:
        transport = self.app[CONFIG_KEY].transport
        self._server = await asyncio.start_server(
            self._accept, transport.host, transport.wyoming_port, reuse_port=reuse_port or None
        )
        logger.info("Wyoming listening on tcp://%s:%d", transport.host, self.port)

    async def start_when_ready(self) -> None:
        """Join the port shared with the other frontends once this one is warmed up, so that no connection lands
        on a frontend that cannot serve it yet (as the HTTP port, ``app.run_app``)."""
        while not self.app[STATE_KEY].accepting:
            await asyncio.sleep(_READY_POLL_S)
        await self.start(reuse_port=True)

    async def close(self) -> None:
        """Stop listening and end every connection at once (after the app's drain: live utterances have finished)."""
        self._closing = True
        if self._server is not None:
            self._server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None  # asyncio runs each connection's callback in a task
        self._tasks.add(task)
        limit = self.app[CONFIG_KEY].limits.max_wyoming_connections
        try:
            if self._serving >= limit:
                refused = error_event(ErrorCode.BUSY, f"the server has its maximum of {limit} Wyoming connections")
                writer.write(encode_event(refused))
                self.app[METRICS_KEY].count_error(ErrorCode.BUSY.value)
            else:
                self._serving += 1
                try:
                    await Connection(self.app, reader, writer).run()
                finally:
                    self._serving -= 1
        except Exception:  # a bug in one connection must not end the listener
            logger.exception("Wyoming connection failed")
        finally:
            try:
                await self._close(reader, writer)
            finally:
                self._tasks.discard(task)

    async def _close(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """End the connection after what was written: the end of our side, then the client's last bytes read until
        it closes its side, within ``--write-timeout-s`` (closing a socket with bytes unread resets it, and the
        client could lose our last events, an ``error`` among them); else, or when the server stops, at once."""
        closed = False
        try:
            if not self._closing and not writer.transport.is_closing():
                if writer.can_write_eof():
                    writer.write_eof()
                await within(_drain_then_read_to_end(reader, writer), self.write_timeout_s)
                writer.close()
                closed = True
        except (ConnectionError, asyncio.TimeoutError):  # not the builtin before Python 3.11
            pass
        finally:
            if not closed:
                writer.transport.abort()

    @property
    def write_timeout_s(self) -> float:
        return self.app[CONFIG_KEY].limits.write_timeout_s


async def _drain_then_read_to_end(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await writer.drain()
    while await reader.read(READ_BYTES):
        pass


class Connection:
    """One Wyoming connection: reads into its ``WyomingCore``, carries out the actions on its own task."""

    def __init__(self, app: web.Application, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.app = app
        self.reader, self.writer = reader, writer
        config = app[CONFIG_KEY]
        self.write_timeout_s = config.limits.write_timeout_s
        limits = config.limits
        self.core = WyomingCore(
            WyomingLimits(
                limits.max_messages_per_s, limits.max_text_chars_per_utterance, limits.max_queued_utterances,
                limits.idle_timeout_s,
            ),
            self._knows_voice,
            time.monotonic(),
        )  # fmt: skip
        self.speaker = app[SPEAKER_KEY]
        self.metrics = app[METRICS_KEY]
        self.rate = self.speaker.info.sample_rate
        self.actions: asyncio.Queue[Action] = asyncio.Queue(QUEUED_ACTIONS)
        self._stream_voice: VoicePrompt | None = None
        """The voice a stream's sentences are spoken in (None: the default voice)."""
        self._stream_prompt: VoicePrompt | None = None
        """The prompt of the stream's next sentence: its voice continued by the sentence before."""

    async def run(self) -> None:
        worker = asyncio.create_task(self._work(), name="voxwire-wyoming-connection")
        try:
            await self._read(worker)
        finally:
            worker.cancel()
            await asyncio.gather(worker, return_exceptions=True)

    def _knows_voice(self, name: str) -> bool:
        try:
            self.app[VOICES_KEY].resolve(name)
        except UnknownVoiceError:
            return False
        return True

    async def _read(self, worker: asyncio.Task[None]) -> None:
        """Feed the core until the client leaves, the core closes, or the worker ends (a write failed); then, unless
        the client left, wait for the worker to send what was queued."""
        while not self.core.closed and not worker.done():
            deadline = self.core.deadline()
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            reading = asyncio.ensure_future(self.reader.read(READ_BYTES))
            await asyncio.wait({reading, worker}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            if not reading.done():
                reading.cancel()
                await asyncio.gather(reading, return_exceptions=True)
                actions = self.core.tick(time.monotonic())
            else:
                data = reading.result()
                if not data:
                    return  # the client left: the worker is cancelled, closing any engine stream
                actions = self.core.receive(data, time.monotonic())
            for action in actions:
                if not await self._queue(action, worker):
                    break
        await worker

    async def _queue(self, action: Action, worker: asyncio.Task[None]) -> bool:
        """Hand ``action`` to the worker, waiting while its queue is full; False if the worker ended meanwhile (its
        client gone), which would leave a full queue undrained."""
        putting = asyncio.ensure_future(self.actions.put(action))
        await asyncio.wait({putting, worker}, return_when=asyncio.FIRST_COMPLETED)
        if putting.done():
            return True
        putting.cancel()
        await asyncio.gather(putting, return_exceptions=True)
        return False

    async def _work(self) -> None:
        while True:
            action = await self.actions.get()
            try:
                if isinstance(action, Close):
                    return
                await self._perform(action)
            except ClientGone:
                return

    async def _perform(self, action: Action) -> None:
        if isinstance(action, SendInfo):
            await self._send(info_event(self.speaker.info, self._voices(), __version__))
        elif isinstance(action, Send):
            await self._send(action.event)
        elif isinstance(action, Speak):
            try:
                await self._speak(action)
            finally:
                if action.part is SpeechPart.WHOLE:
                    self.core.released(time.monotonic())
        elif isinstance(action, EndStream):
            await self._send(WyomingEvent("synthesize-stopped"))
            self.core.released(time.monotonic())

    async def _send(self, event: WyomingEvent) -> None:
        if event.type == "error":
            self.metrics.count_error(event.data["code"])
        self.writer.write(encode_event(event))
        try:
            await within(self.writer.drain(), self.write_timeout_s)
        except (ConnectionError, asyncio.TimeoutError) as exc:  # gone, or not reading: free its socket now
            self.writer.transport.abort()
            raise ClientGone() from exc

    def _voices(self) -> list[VoiceEntry]:
        """``default``, OpenAI's names (designed voices on VoxCPM2), then the saved voices by id; each described by
        its name and what it sounds like (Home Assistant shows the description)."""
        info = self.speaker.info
        own = f"{info.name}'s own voice"
        builtin = [
            VoiceEntry(name, f"{name}: {OPENAI_VOICE_DESIGNS.get(name, own) if info.voice_design else own}")
            for name in ("default", *sorted(OPENAI_VOICES))
        ]
        return builtin + [VoiceEntry(saved.id, saved.name) for saved in self.app[VOICES_KEY].infos()]

    async def _speak(self, action: Speak) -> None:
        if action.part is SpeechPart.FIRST_SENTENCE:  # nothing of an earlier stream carries over, even if refused
            self._stream_voice = self._stream_prompt = None
        refused = refusal(self.app, connection=False)
        if refused is not None:
            await self._send(error_event(refused.code, refused.message))
            return
        try:
            voice = self.app[VOICES_KEY].resolve(action.voice)
        except UnknownVoiceError:  # deleted since the request named it
            await self._send(error_event(ErrorCode.UNKNOWN_VOICE, f"no voice {action.voice!r}"))
            return
        if action.part is SpeechPart.FIRST_SENTENCE:
            self._stream_voice = self._stream_prompt = voice
        prompt = voice if action.part is SpeechPart.WHOLE else self._stream_prompt
        control = utterance_control(self.speaker.info, action.voice, voice, None)
        options = UtteranceOptions(owner=client_owner(None, self), max_ahead_s=math.inf)
        request_id = self.speaker.new_request_id("wyoming")
        job = SpeechJob(request_id, designed_text(control, action.text), SynthesisParams(), prompt, options)
        patches: list[Patch] = []
        with self.app[STATE_KEY].utterance():
            try:
                final = await self._stream_audio(job, patches)
            except SpeechFailure as exc:
                self._count_failure(exc)
                await self._send(error_event(exc.code, str(exc)))
                return
        if action.part is not SpeechPart.WHOLE:  # the stream's next sentence continues this one, as on the WebSocket
            try:
                self._stream_prompt = next_prompt(
                    self._stream_voice, prompt, action.text, final, patches, designed=control is not None
                )
            except InvalidInputError:  # non-finite latents: never fed back; the next sentence starts from the voice
                self._stream_prompt = self._stream_voice

    async def _stream_audio(self, job: SpeechJob, patches: list[Patch]) -> FinishReason:
        """Speak ``job``: ``audio-start`` with its first output (a refusal comes before it), ``audio-chunk``s as the
        engine makes them, ``audio-stop``; its finish reason."""
        encoder = make_encoder(AudioFormat.PCM_S16LE, self.rate)
        encoders = self.app[ENCODERS_KEY]
        audio_format = {"rate": self.rate, "width": SAMPLE_WIDTH, "channels": 1}
        started = time.perf_counter()
        samples = 0
        reason: FinishReason | None = None
        announced = False
        try:
            async with contextlib.aclosing(self.speaker.speak(job)) as outputs:
                async for output in outputs:  # a refusal is raised here, before any audio
                    if not announced:
                        announced = True
                        self.metrics.observe_first_audio(time.perf_counter() - started)
                        await self._send(WyomingEvent("audio-start", audio_format))
                    samples += output.audio.size
                    if output.patch is not None:
                        patches.append(output.patch)
                    for block in await encoders.encode(encoder, output.audio):
                        await self._send(WyomingEvent("audio-chunk", audio_format, block))
                    reason = output.finish_reason
        except ClientGone:
            self.metrics.count_dropped("client_disconnected")
            raise
        finally:
            self.metrics.add_audio(samples / self.rate)
        for block in await encoders.finish(encoder):
            await self._send(WyomingEvent("audio-chunk", audio_format, block))
        await self._send(WyomingEvent("audio-stop"))
        assert reason is not None, "the engine ends every stream with a finish reason"
        self.metrics.count_utterance(reason.value)
        return reason

    def _count_failure(self, exc: SpeechFailure) -> None:
        if exc.finish is not None:
            self.metrics.count_utterance(exc.finish.value)
            self.metrics.count_dropped("shutdown" if exc.finish is FinishReason.ABORTED else exc.code.value)


WYOMING_KEY: web.AppKey[WyomingListener] = web.AppKey("voxwire.wyoming")
"""The app's Wyoming listener, when ``--wyoming-port`` is set."""


def add_wyoming_listener(app: web.Application) -> None:
    """Serve Wyoming beside ``app`` when ``--wyoming-port`` is set: started with the app (in a frontend of
    ``--workers``, once it is warmed up), stopped at its cleanup, after the drain."""
    if app[CONFIG_KEY].transport.wyoming_port is None:
        return
    app[WYOMING_KEY] = WyomingListener(app)
    app.cleanup_ctx.append(_lifecycle)


async def _lifecycle(app: web.Application) -> AsyncIterator[None]:
    listener = app[WYOMING_KEY]
    # A frontend of --workers has the server's connection seats (liveness.Pulse); one process has its own.
    one_process = isinstance(app[STATE_KEY].seats, OneProcess)
    joining = None if one_process else asyncio.create_task(listener.start_when_ready(), name="voxwire-wyoming-join")
    if one_process:
        await listener.start(reuse_port=False)  # a port in use stops the start-up here
    try:
        yield
    finally:
        if joining is not None:
            joining.cancel()
            await asyncio.gather(joining, return_exceptions=True)
        await listener.close()
