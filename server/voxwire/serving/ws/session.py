"""``Session``: the asyncio driver of one WebSocket connection (``/v1/tts/stream``, or ElevenLabs' endpoints through
their dialect), independent of aiohttp.

Every rule (admission, text buffering, the utterance lifecycle, idleness) lives in ``SessionCore``;
this module feeds it events with ``time.monotonic()`` and carries out the actions it returns. It
owns what needs an event loop: the tasks (the outbox's sender, one per segment being spoken or
utterance being finished), the one timer that wakes the core at its ``deadline``, the engine
streams, the encoders and the socket (its ``Outbox`` of typed events, and ``Transport.close``).

Each segment is an engine request whose prompt continues the previous segment's voice, or for a designed
utterance (its control before each sentence, ``text/design.py``) has its first segment's audio as reference
(``UtteranceAudio.carry``). Cancellation flows one way: cancelling a task closes its engine stream,
which aborts the request between two engine steps and frees its slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Coroutine
from types import TracebackType
from typing import Any

import numpy as np

from voxwire.chunk import Patch
from voxwire.engine import Chunk
from voxwire.errors import InvalidInputError
from voxwire.finish_reason import FinishReason
from voxwire.protocol.error_codes import ErrorCode
from voxwire.protocol.wire import CloseCode, Done, Error, Segment, Start, Words
from voxwire.serving.runtime.encoding import INLINE, EncoderPool
from voxwire.serving.runtime.keys import ServerState
from voxwire.serving.runtime.metrics import Metrics
from voxwire.serving.runtime.tracing import SEGMENT_SPAN, Tracing, traced
from voxwire.serving.server_config import ServerConfig
from voxwire.serving.speech.alignment import WordTimer, WordTiming
from voxwire.serving.speech.service import Speaker, SpeechFailure, SpeechJob, UtteranceOptions
from voxwire.serving.speech.voice_store import VoiceStore
from voxwire.serving.ws.outbox import Outbox, SlowConsumerError, Transport
from voxwire.serving.ws.session_core import (
    CLIENT_GONE,
    OUR_PROTOCOL,
    Action,
    Announce,
    CloseSocket,
    Dialect,
    FinishAudio,
    OpenUtterance,
    Preload,
    SendClose,
    SendContextEnd,
    SendDone,
    SendError,
    SessionCore,
    SessionLimits,
    SpeakSegment,
    StopAll,
    StopUtterance,
    sayable,
)
from voxwire.serving.ws.utterance import Settings, StartDefaults, UtteranceAudio, ready_message, resolve_settings
from voxwire.text.design import designed_text
from voxwire.text.normalize import normalize_in_worker, preload_in_worker

logger = logging.getLogger(__name__)


def session_limits(config: ServerConfig) -> SessionLimits:
    return SessionLimits(
        max_message_bytes=config.limits.max_message_bytes,
        max_messages_per_s=config.limits.max_messages_per_s,
        max_text_chars_per_message=config.limits.max_text_chars_per_message,
        max_text_chars_per_utterance=config.limits.max_text_chars_per_utterance,
        max_queued_utterances=config.limits.max_queued_utterances,
        idle_timeout_s=config.limits.idle_timeout_s,
        max_contexts=config.limits.max_contexts,
    )


def _segment_attributes(audio: UtteranceAudio, index: int) -> dict[str, str | int]:
    """A sentence's span attributes: which utterance (and context) of the connection it belongs to."""
    attributes: dict[str, str | int] = {"voxwire.utterance.number": audio.number, "voxwire.segment.index": index}
    if audio.context_id is not None:
        attributes["voxwire.context_id"] = audio.context_id
    return attributes


class Session:
    """One connection. Use ``async with``; feed it frames; it never raises for a client's mistake."""

    def __init__(
        self,
        service: Speaker,
        config: ServerConfig,
        voices: VoiceStore,
        server: ServerState,
        transport: Transport,
        metrics: Metrics | None = None,
        encoders: EncoderPool = INLINE,
        owner: str | None = None,
        tracing: Tracing | None = None,
        dialect: Dialect = OUR_PROTOCOL,
    ) -> None:
        """``owner``: who the connection's persona slots count against (``personas.client_owner``; None: no cap).
        ``tracing``: each sentence's engine request becomes a ``voxwire.segment`` span (None: traces are off).
        ``dialect``: what the client's frames mean (``transport`` writes the same dialect)."""
        self.service = service
        self.owner = owner
        self.tracing = tracing
        self.encoders = encoders
        self.config = config
        self.server = server
        self.transport = transport
        self.metrics = metrics
        self.outbox = Outbox(transport, config.limits.max_unsent_audio_s)
        limits = config.engine.engine_config().limits
        defaults = StartDefaults.of(config)

        def resolve(start: Start) -> Settings:
            return resolve_settings(start, voices, service, limits, defaults)

        self.core = SessionCore(session_limits(config), resolve, server, time.monotonic(), dialect)
        self._audio: dict[int, UtteranceAudio] = {}
        """The utterances being spoken or sent, by number."""
        self._work: dict[int, asyncio.Task[None]] = {}
        """Each utterance's task on the service now (a segment, or its last audio), by number."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        """When ``_timer`` fires (inf: not armed)."""
        self._closing: asyncio.Task[None] | None = None

    # ---- lifecycle -------------------------------------------------------------------------------------------

    async def __aenter__(self) -> Session:
        self._spawn(self.outbox.run())
        self._apply(self.core.opened())
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        tasks = list(self._tasks)
        self._apply(self.core.disconnected())
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._closing is not None:
            await self._closing

    def receive(self, data: str) -> None:
        """Handle one text frame."""
        self._apply(self.core.receive(data, time.monotonic()))

    def receive_binary(self) -> None:
        self._apply(self.core.receive_binary(time.monotonic()))

    def shut(self, code: CloseCode, reason: str, text: str) -> None:
        """End the connection now (see ``SessionCore.shut``)."""
        self._apply(self.core.shut(code, reason, text))

    # ---- carrying out the core's actions ---------------------------------------------------------------------

    def _apply(self, actions: list[Action]) -> None:
        for action in actions:
            match action:
                case Announce(settings, context_id):
                    info, opus = self.service.info, self.config.audio.opus_settings()
                    self.outbox.put(ready_message(settings, info, opus, context_id))
                case Preload():
                    self._spawn(preload_in_worker())
                case SendError(code, message, utterance, context_id):
                    if self.metrics is not None:
                        self.metrics.count_error(code.value)
                    self.outbox.put(Error(code.value, message, utterance, context_id=context_id))
                case OpenUtterance(number, settings, context_id):
                    rate, opus = self.service.info.sample_rate, self.config.audio.opus_settings()
                    self._audio[number] = UtteranceAudio(number, settings, rate, opus, time.monotonic(), context_id)
                case SpeakSegment():
                    self._work[action.utterance] = self._spawn(self._speak(action))
                case FinishAudio(number):
                    self._work[number] = self._spawn(self._finish_audio(number))
                case StopUtterance(number):
                    if (task := self._work.pop(number, None)) is not None:
                        task.cancel()
                    self.outbox.drop(number)
                case SendDone(number, reason):
                    self._send_done(number, reason)
                case SendContextEnd(context_id):
                    self.outbox.put_context_end(context_id)
                case SendClose():
                    self.outbox.put_close()
                case StopAll(dropped):
                    self._stop_all(dropped)
                case CloseSocket(code, reason):
                    logger.info("closing a WebSocket session: %s", reason)
                    self._closing = asyncio.ensure_future(self.transport.close(code, reason))
        self._arm_timer()

    def _send_done(self, number: int, reason: FinishReason) -> None:
        """Queue ``done``, built when its turn comes (with what the socket took); the core releases it once sent."""
        audio = self._audio[number]
        self._work.pop(number, None)
        if self.metrics is not None:
            self.metrics.count_utterance(reason.value)

        def sent() -> None:
            self._audio.pop(number, None)
            self._apply(self.core.done_sent(number))

        self.outbox.put(lambda: self._done(audio, reason), sent=sent)

    def _stop_all(self, dropped: str | None) -> None:
        """Cancel every task (engine requests are aborted as their streams close) and the timer."""
        if dropped is not None and self.metrics is not None:
            self.metrics.count_dropped(dropped)
        self._disarm_timer()
        for task in self._tasks:
            task.cancel()
        self._work.clear()
        self._audio.clear()

    def _arm_timer(self) -> None:
        """Wake the core at its deadline; a timer set for a later one is moved earlier, one for an earlier one fires
        and re-arms (cheaper than moving it on every message)."""
        deadline = self.core.deadline
        if deadline is None or self._timer_at <= deadline:
            return
        self._disarm_timer()
        self._timer_at = deadline
        self._timer = asyncio.get_running_loop().call_later(max(0.0, deadline - time.monotonic()), self._on_timer)

    def _disarm_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_at = None, math.inf

    def _on_timer(self) -> None:
        self._timer, self._timer_at = None, math.inf
        self._apply(self.core.tick(time.monotonic()))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        exc = None if task.cancelled() else task.exception()
        if isinstance(exc, ConnectionError):  # the sender found the socket gone
            self.shut(CloseCode.GOING_AWAY, CLIENT_GONE, "the connection broke")
        elif exc is not None:
            logger.error("WebSocket session task failed", exc_info=exc)
            self.shut(CloseCode.INTERNAL_ERROR, ErrorCode.INTERNAL_ERROR.value, "server bug; see the server log")

    # ---- speaking --------------------------------------------------------------------------------------------

    async def _speak(self, turn: SpeakSegment) -> None:
        """One sentence: normalized, spoken on the service, its audio to the outbox; then told to the core."""
        audio = self._audio[turn.utterance]
        spoken = await self._spoken(audio, turn.text)
        finish: FinishReason | None = None
        try:
            if sayable(spoken):  # normalization may leave nothing to say (e.g. only a code span)
                finish = await self._speak_segment(audio, turn, spoken)
        except SpeechFailure as exc:
            self._apply(self.core.segment_failed(turn.utterance, exc.code, str(exc), time.monotonic()))
        except SlowConsumerError as exc:
            self.shut(CloseCode.SLOW_CONSUMER, ErrorCode.SLOW_CONSUMER.value, str(exc))
        else:
            self._apply(self.core.segment_spoken(turn.utterance, finish))

    async def _spoken(self, audio: UtteranceAudio, text: str) -> str:
        """The sentence as it is to be spoken: normalized on the normalization thread when asked for."""
        if not audio.settings.normalize:
            return text
        try:
            return await normalize_in_worker(text)
        except Exception:  # a normalizer failure costs this sentence its normalization, not the utterance
            logger.exception("normalization failed; speaking the sentence as written")
            return text

    async def _speak_segment(self, audio: UtteranceAudio, turn: SpeakSegment, spoken: str) -> FinishReason:
        """One sentence through the engine (``spoken``, designed by ``turn.control``); its audio goes to the
        outbox as it comes, and its words as they settle (``WordTimer``), each part after the audio it times."""
        index, text = turn.index, turn.text
        params = audio.settings.segment_params(index)
        request_id = self.service.new_request_id("ws")
        if audio.first_request_at is None:
            audio.first_request_at = time.monotonic()
        start = audio.samples
        word_timer = WordTimer(text, audio.model_rate, audio.speaking_rate)
        patches: list[Patch] = []
        final: Chunk | None = None
        # A sentence after the first continues a stream already playing: its deadline is where the
        # listener's buffer runs dry, not a fresh lead after its own first chunk.
        lead, due = audio.playback_lead_s, audio.playback_due()
        settings = audio.settings
        options = UtteranceOptions(
            settings.persona, playback_lead_s=lead, playback_due=due, playback_speed=audio.speed,
            max_ahead_s=settings.max_ahead_ms / 1000, owner=self.owner,
        )  # fmt: skip
        job = SpeechJob(request_id, designed_text(turn.control, spoken), params, audio.prompt, options)
        speech = self.service.speak(job)
        if self.tracing is not None:
            speech = traced(speech, self.tracing.utterance(SEGMENT_SPAN, _segment_attributes(audio, index)))
        async with contextlib.aclosing(speech) as stream:
            async for final in stream:
                if final.audio.size:
                    if audio.samples == start:  # this sentence's first audio
                        self._announce(audio, index, text, spoken)
                    await self._on_chunk(audio, final.audio)
                    if settled := word_timer.add(final.audio):  # after the frames it times
                        self.outbox.put(self._words(audio, index, settled, start))
                if final.patch is not None:
                    patches.append(final.patch)
        # Failures (refused, engine gone, ended in error or by shutdown) leave as a SpeechFailure.
        assert final is not None and final.finish_reason is not None  # the engine always ends a stream
        if word_timer.meter.samples:
            rest = word_timer.finish(learn=final.finish_reason is FinishReason.STOP)
            self.outbox.put(self._words(audio, index, rest, start))
        try:
            audio.carry(spoken, final.finish_reason, patches, designed=turn.control is not None)
        except InvalidInputError as exc:  # the model produced non-finite latents: never feed them back
            raise SpeechFailure(ErrorCode.SYNTHESIS_FAILED, str(exc)) from None
        return final.finish_reason

    @staticmethod
    def _words(audio: UtteranceAudio, index: int, words: list[WordTiming], start: int) -> Words:
        """The next of the segment's words (``WordTimer``'s times from the segment's first sample), on the
        utterance's timeline (``start``: the segment's first model sample), after its ``speed``."""
        offset_s, speed = start / audio.model_rate, audio.speed
        return Words(
            audio.number, index, tuple(word.word for word in words),
            tuple((offset_s + word.start_s) / speed for word in words),
            tuple((offset_s + word.end_s) / speed for word in words),
            context_id=audio.context_id,
        )  # fmt: skip

    def _announce(self, audio: UtteranceAudio, index: int, text: str, spoken: str) -> None:
        audio.started += 1
        segment = Segment(audio.number, index, text, audio.start_sample, spoken, context_id=audio.context_id)
        self.outbox.put(segment)

    async def _on_chunk(self, audio: UtteranceAudio, chunk: np.ndarray) -> None:
        now = time.monotonic()
        self.core.audio_produced(now)
        if audio.first_chunk_at is None:
            audio.first_chunk_at = now
        audio.samples += chunk.size
        seconds = chunk.size / audio.model_rate / audio.speed
        self.outbox.put_audio(audio.delivery, await self.encoders.encode(audio.encoder, chunk), seconds)

    async def _finish_audio(self, number: int) -> None:
        """The utterance's last audio (what its encoder still holds) to the outbox; then told to the core."""
        audio = self._audio[number]
        try:
            self.outbox.put_audio(audio.delivery, await self.encoders.finish(audio.encoder), 0.0)
        except SlowConsumerError as exc:
            self.shut(CloseCode.SLOW_CONSUMER, ErrorCode.SLOW_CONSUMER.value, str(exc))
            return
        self._apply(self.core.audio_finished(number, time.monotonic()))

    def _done(self, audio: UtteranceAudio, reason: FinishReason) -> Done:
        done = audio.done(reason)
        if self.metrics is not None:
            self.metrics.add_audio(done.audio_s)
            if done.ttfa_s is not None:
                self.metrics.observe_first_audio(done.ttfa_s)
        return done
