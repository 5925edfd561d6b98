"""``EngineProxy``: a frontend process's ``Service``, speaking to the engine process over ZeroMQ.

It implements the same interface as ``SpeechService`` (``speak``, ``abort``, ``encode_voice``, ``stats``),
so the handlers, sessions and encoders of a frontend are the single-process server's, unchanged. One
reader task takes the engine's messages: an ``Outputs`` message carries a whole step's outputs for this
frontend's requests, fanned out to their streams by ``OutputStreams``. ``SharedVoiceStore`` keeps the
frontends' voices equal: a voice saved or deleted here is announced to the engine, which tells the others.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from collections.abc import AsyncGenerator, Callable
from pathlib import Path

import zmq
import zmq.asyncio

from voxstream.audio.clip import AudioSource
from voxstream.engine import EngineDeadError, EngineStats, Request, StepOutput, SynthesisParams
from voxstream.engine.streams import OutputStreams
from voxstream.prompt import VoicePrompt
from voxstream.serving import ipc
from voxstream.serving.config import ServerConfig
from voxstream.serving.personas import PersonaRegistry, UnknownPersonaError, check_persona
from voxstream.serving.protocol import ErrorCode
from voxstream.serving.service import SpeechFailure, engine_queue_full, refused, typed_failures
from voxstream.serving.voices import Voice, VoiceInfo, VoiceStore

logger = logging.getLogger(__name__)

STOPPED = "the engine is stopped"
VOICE_SYNC_TIMEOUT_S = 5.0


class EngineProxy:
    """The engine process, seen from one frontend. Build it with ``await EngineProxy.connect(...)``."""

    def __init__(self, socket: zmq.asyncio.Socket, welcome: ipc.Welcome, config: ServerConfig) -> None:
        self._socket = socket
        self._max_waiting = config.max_waiting
        self._max_running = config.max_sessions
        self.info = welcome.info
        self.patch_shape = welcome.patch_shape
        self.prefill_tokens = welcome.prompt_length
        self.initial_voices = welcome.voices
        self.personas: PersonaRegistry | None = None
        """LoRA personas are not served with ``--workers`` (the config refuses ``--lora`` with it)."""
        self._streams = OutputStreams()
        self._stats = EngineStats()
        self._ids = itertools.count()
        self._prefix = f"{os.getpid()}"
        self._calls = itertools.count()
        self._voice_calls: dict[int, asyncio.Future[VoicePrompt]] = {}
        self._syncs: dict[int, asyncio.Future[None]] = {}
        self._reader: asyncio.Task[None] | None = None
        self.on_voices: Callable[[ipc.VoicesChanged], None] = lambda changes: None
        """Called with the voices other frontends saved or deleted."""

    @classmethod
    async def connect(cls, endpoint: str, index: int, config: ServerConfig) -> EngineProxy:
        """Connect as frontend ``index`` and wait for the engine's ``Welcome`` (it may still be loading the model).

        ``config``: the server's, for the engine's queue rule (``queue_full``)."""
        socket = zmq.asyncio.Context.instance().socket(zmq.DEALER)
        socket.setsockopt(zmq.IDENTITY, ipc.frontend_identity(index))
        socket.setsockopt(zmq.SNDHWM, 0)
        socket.setsockopt(zmq.RCVHWM, 0)
        socket.setsockopt(zmq.LINGER, 500)  # let the aborts of a stopping frontend reach the engine
        socket.connect(endpoint)
        await socket.send(ipc.dumps(ipc.Hello(os.getpid())))
        while not isinstance(message := ipc.loads((await socket.recv_multipart())[0]), ipc.Welcome):
            pass  # outputs still addressed to a previous process with this identity
        return cls(socket, message, config)

    async def start(self) -> None:
        self._reader = asyncio.create_task(self._read(), name="voxstream-engine-proxy")

    async def stop(self) -> None:
        """Abort this frontend's requests and fail what is still open; the engine keeps serving the others."""
        for request_id in self._streams.request_ids():
            self.abort(request_id)
        self._fail(STOPPED)
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        self._socket.close()

    def engine_died(self) -> None:
        """The supervisor saw the engine process exit: every stream and voice call fails now."""
        logger.error("the engine process died: failing %d open stream(s)", len(self._streams))
        self._fail("the engine process died")

    def new_request_id(self, prefix: str = "req") -> str:
        # The pid keeps ids unique across frontends and across a frontend's restarts.
        return f"{prefix}-{self._prefix}-{next(self._ids)}"

    def speak(
        self,
        request_id: str,
        text: str,
        params: SynthesisParams,
        voice: VoicePrompt | None = None,
        *,
        persona: str | None = None,
        playback_lead_s: float | None = None,
        playback_due: float | None = None,
    ) -> AsyncGenerator[StepOutput, None]:
        """Stream one utterance; closing the iterator early aborts it, and every failure raises one
        ``SpeechFailure`` (as ``SpeechService.speak``, including the real-time deadline inputs:
        ``time.monotonic`` is one clock for every process of the machine)."""
        try:
            self.check_persona(persona)
        except UnknownPersonaError as exc:
            return refused(SpeechFailure(ErrorCode.UNKNOWN_PERSONA, str(exc)))
        request = Request(
            request_id, text, self.prefill_tokens(text, voice), params, voice, playback_lead_s, playback_due
        )
        return typed_failures(self._speak(request))

    async def _speak(self, request: Request) -> AsyncGenerator[StepOutput, None]:
        request_id = request.request_id
        channel = self._streams.open(request_id)
        self._send(ipc.Add(request))
        async for output in self._streams.stream(request_id, channel, self.abort):
            yield output

    def check_persona(self, persona: str | None) -> None:
        check_persona(self.personas, persona)

    def abort(self, request_id: str) -> None:
        if self._streams.closed_reason is None:
            self._send(ipc.Abort(request_id))

    def stats(self) -> EngineStats:
        return self._stats

    @property
    def queue_full(self) -> bool:
        """Whether the engine's queue was full at its latest step or heartbeat (a new request would be refused)."""
        return engine_queue_full(self._stats, self._max_waiting, self._max_running)

    async def encode_voice(
        self,
        *,
        text: str | None = None,
        audio: AudioSource | None = None,
        reference_audio: AudioSource | None = None,
        sample_rate: int | None = None,
    ) -> VoicePrompt:
        """Encode a voice clip in the engine process (the model and its device live there)."""
        if self._streams.closed_reason is not None:
            raise EngineDeadError(self._streams.closed_reason)
        call_id = next(self._calls)
        future: asyncio.Future[VoicePrompt] = asyncio.get_running_loop().create_future()
        self._voice_calls[call_id] = future
        kwargs = {
            "text": text,
            "audio": audio,
            "sample_rate": sample_rate,
            "reference_audio": reference_audio,
            "reference_sample_rate": sample_rate,
        }
        self._send(ipc.EncodeVoice(call_id, kwargs))
        try:
            return await future
        finally:
            self._voice_calls.pop(call_id, None)

    async def publish_voice(self, voice: Voice | None = None, deleted: str | None = None) -> None:
        """Tell the other frontends about a saved or deleted voice; returns once all of them have it (or after
        ``VOICE_SYNC_TIMEOUT_S``, if one does not answer), so the client's next request finds it everywhere."""
        call_id = next(self._calls)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._syncs[call_id] = future
        self._send(ipc.VoiceSaved(call_id, voice) if voice is not None else ipc.VoiceDeleted(call_id, deleted or ""))
        try:
            await asyncio.wait_for(future, VOICE_SYNC_TIMEOUT_S)
        except asyncio.TimeoutError:
            logger.warning("a voice change reached the other frontends late (over %.0f s)", VOICE_SYNC_TIMEOUT_S)
        finally:
            self._syncs.pop(call_id, None)

    # ---- the engine's messages ------------------------------------------------------------------------------

    def _send(self, message: object) -> None:
        # Unbounded high-water mark: the send never blocks, and its future is already done.
        self._socket.send(ipc.dumps(message), zmq.NOBLOCK)

    async def _read(self) -> None:
        while True:
            frames = await self._socket.recv_multipart()
            message = ipc.loads(frames[0])
            if isinstance(message, ipc.Outputs):
                self._stats = message.stats
                self._streams.dispatch(ipc.unpack_outputs(message, frames[1]))
            elif isinstance(message, ipc.Heartbeat):
                self._stats = message.stats
            elif isinstance(message, ipc.Rejected):
                self._streams.reject(message.request_id, message.error)
            elif isinstance(message, ipc.VoiceEncoded):
                self._resolve(message)
            elif isinstance(message, ipc.VoicesChanged):
                self.on_voices(message)
                self._send(ipc.VoicesApplied(message.sync))
            elif isinstance(message, ipc.VoicesSynced):
                synced = self._syncs.get(message.call_id)
                if synced is not None and not synced.done():
                    synced.set_result(None)

    def _resolve(self, encoded: ipc.VoiceEncoded) -> None:
        future = self._voice_calls.get(encoded.call_id)
        if future is None or future.done():
            return  # the caller left
        if encoded.error is not None:
            future.set_exception(encoded.error)
        else:
            assert encoded.prompt is not None
            future.set_result(encoded.prompt)

    def _fail(self, reason: str) -> None:
        self._streams.close(reason)
        for future in self._voice_calls.values():
            if not future.done():
                future.set_exception(EngineDeadError(reason))
        for synced in self._syncs.values():  # no other frontend is left to tell
            if not synced.done():
                synced.set_result(None)


class SharedVoiceStore(VoiceStore):
    """A frontend's ``VoiceStore`` that tells the other frontends (through the engine) what it saves and deletes."""

    def __init__(self, proxy: EngineProxy, directory: Path | None, max_voices: int) -> None:
        super().__init__(directory, proxy.info.name, proxy.patch_shape, max_voices)
        self._proxy = proxy
        for voice in proxy.initial_voices:
            self.adopt(voice)
        proxy.on_voices = self._apply

    async def add(
        self, prompt: VoicePrompt, *, name: str | None, duration_s: float, owner: str | None = None
    ) -> VoiceInfo:
        info = await super().add(prompt, name=name, duration_s=duration_s, owner=owner)
        await self._proxy.publish_voice(self.get(info.id))
        return info

    async def delete(self, voice_id: str, owner: str | None = None) -> None:
        await super().delete(voice_id, owner)
        await self._proxy.publish_voice(deleted=voice_id)

    def _apply(self, changes: ipc.VoicesChanged) -> None:
        for voice in changes.saved:
            self.adopt(voice)
        for voice_id in changes.deleted:
            self.forget(voice_id)
