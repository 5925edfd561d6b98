"""A LiveKit Agents TTS over voxwire's WebSocket (``pip install 'voxwire[livekit]'``).

``TTS`` is a ``livekit.agents.tts.TTS`` with streaming, shaped like LiveKit's own plugins:

- ``TTS(base_url=..., api_key=..., voice=...)``; ``update_options(voice=..., persona=...)`` changes the
  settings of the streams that start afterwards; ``prewarm()`` opens the connection ahead of the first turn.
- Connections come from LiveKit's ``utils.ConnectionPool``: a turn takes one, and gives it back when its
  utterance is done (or cancelled), so the next turn reuses it without a handshake; a ``start`` goes out only
  when the options changed since that connection's last one.
- ``stream()`` sends the language model's text as it arrives (the server starts a sentence as soon as it is
  complete and continues the voice from one sentence to the next); LiveKit's ``flush`` ends the turn's
  utterance. ``synthesize()`` speaks a whole text. Closing a stream early (LiveKit does so on an
  interruption) sends ``cancel``, which stops the server's work within one engine step.
- Timed transcripts (``aligned_transcript``): each word as a ``TimedString`` with its ``start_time`` and
  ``end_time`` (seconds from the turn's first audio), from the server's ``words`` messages, which come while
  a sentence is still produced: at an interruption LiveKit's transcript synchronizer has the words timed up to
  it. The times are the server's estimates from the audio it produced.

    from livekit.agents import AgentSession
    from voxwire.integrations import livekit as voxwire

    session = AgentSession(tts=voxwire.TTS(base_url="ws://127.0.0.1:8000", api_key="...", voice="default"), ...)
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import AsyncIterable, Awaitable
from dataclasses import replace
from typing import NoReturn, TypeVar

from livekit.agents import (
    APIConnectionError,
    APIConnectOptions,
    APIError,
    APIStatusError,
    APITimeoutError,
    tts,
    utils,
)
from livekit.agents.types import DEFAULT_API_CONNECT_OPTIONS, NOT_GIVEN, NotGivenOr, TimedString

from voxwire.client.errors import ClientError, ServerError
from voxwire.integrations.session import (
    DEFAULT_URL,
    Audio,
    SpeechSession,
    SpeechSettings,
    is_permanent,
    word_timings,
)
from voxwire.protocol.error_codes import ErrorCode
from voxwire.protocol.wire import Done, Error, Words

DEFAULT_SAMPLE_RATE = 24000
"""What the TTS hands LiveKit (LiveKit's own OpenAI TTS uses 24 kHz)."""

_T = TypeVar("_T")

_End = object()
"""Marks the end of a turn's text: LiveKit's flush, or the end of its input."""


class TTS(tts.TTS[NoReturn]):
    """voxwire as a LiveKit Agents TTS; ``api_key`` defaults to ``$VOXWIRE_TOKEN``."""

    def __init__(
        self,
        *,
        base_url: str = DEFAULT_URL,
        api_key: str | None = None,
        voice: str | None = None,
        persona: str | None = None,
        instructions: str | None = None,
        seed: int | None = None,
        cfg_value: float | None = None,
        inference_timesteps: int | None = None,
        max_buffer_delay_ms: int | None = None,
        normalize: bool | None = None,
        sample_rate: int = DEFAULT_SAMPLE_RATE,
    ) -> None:
        super().__init__(
            capabilities=tts.TTSCapabilities(streaming=True, aligned_transcript=True),
            sample_rate=sample_rate,
            num_channels=1,
        )
        self._base_url = base_url
        self._api_key = api_key
        self._settings = SpeechSettings(
            voice=voice, persona=persona, instructions=instructions, seed=seed, cfg_value=cfg_value,
            inference_timesteps=inference_timesteps, max_buffer_delay_ms=max_buffer_delay_ms, normalize=normalize,
        )  # fmt: skip
        self._pool = utils.ConnectionPool[SpeechSession](
            connect_cb=self._connect, close_cb=_close, connect_timeout=DEFAULT_API_CONNECT_OPTIONS.timeout
        )
        self._streams = weakref.WeakSet[tts.SynthesizeStream]()

    @property
    def model(self) -> str:
        return "voxcpm"

    @property
    def provider(self) -> str:
        return "voxwire"

    @property
    def settings(self) -> SpeechSettings:
        """What the next stream speaks with."""
        return self._settings

    def update_options(
        self,
        *,
        voice: NotGivenOr[str | None] = NOT_GIVEN,
        persona: NotGivenOr[str | None] = NOT_GIVEN,
        instructions: NotGivenOr[str | None] = NOT_GIVEN,
        seed: NotGivenOr[int | None] = NOT_GIVEN,
        cfg_value: NotGivenOr[float | None] = NOT_GIVEN,
        inference_timesteps: NotGivenOr[int | None] = NOT_GIVEN,
        max_buffer_delay_ms: NotGivenOr[int | None] = NOT_GIVEN,
        normalize: NotGivenOr[bool | None] = NOT_GIVEN,
    ) -> None:
        """Change the settings of the streams that start from now on (None: the server's default)."""
        old = self._settings
        self._settings = replace(
            old,
            voice=_given_or(voice, old.voice),
            persona=_given_or(persona, old.persona),
            instructions=_given_or(instructions, old.instructions),
            seed=_given_or(seed, old.seed),
            cfg_value=_given_or(cfg_value, old.cfg_value),
            inference_timesteps=_given_or(inference_timesteps, old.inference_timesteps),
            max_buffer_delay_ms=_given_or(max_buffer_delay_ms, old.max_buffer_delay_ms),
            normalize=_given_or(normalize, old.normalize),
        )

    def prewarm(self) -> None:
        """Open a connection with the current options now, so the first turn starts without a handshake."""
        self._pool.prewarm()

    def synthesize(
        self, text: str, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS
    ) -> tts.ChunkedStream:
        return _ChunkedStream(tts=self, input_text=text, conn_options=conn_options)

    def stream(self, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS) -> tts.SynthesizeStream:
        stream = _SynthesizeStream(tts=self, conn_options=conn_options)
        self._streams.add(stream)
        return stream

    async def aclose(self) -> None:
        for stream in list(self._streams):
            await stream.aclose()
        await self._pool.aclose()

    async def _connect(self, timeout: float) -> SpeechSession:
        try:
            return await asyncio.wait_for(
                SpeechSession.open(self._base_url, self._api_key, self._settings, self.sample_rate), timeout
            )
        except ClientError as exc:
            raise _api_error(exc) from exc
        except asyncio.TimeoutError:
            raise APITimeoutError(f"no connection to {self._base_url} within {timeout:g} s") from None

    async def _speak(
        self, texts: AsyncIterable[str | object], emitter: tts.AudioEmitter, segment_id: str | None, timeout: float
    ) -> None:
        """One turn on a pooled connection: its text as one utterance, its audio and timings to ``emitter``.

        ``texts`` yields the turn's text and may end with ``_End``; ``segment_id`` wraps the audio in a segment
        (streams). The connection goes back to the pool once the utterance is done or cancelled; a connection
        that failed is closed instead.
        """
        session = await self._pool.get(timeout=timeout)
        while session.closed:  # the server closed it while it sat idle in the pool
            self._pool.remove(session)
            session = await self._pool.get(timeout=timeout)
        reusable = False
        player: asyncio.Task[None] | None = None
        try:
            utterance = session.next_utterance
            player = asyncio.create_task(_play(session, utterance, emitter, segment_id))
            await _until_ready(session.configure(self._settings), player)
            reusable = True  # from here a cancel leaves the connection ready for the next turn
            async for item in texts:
                if item is _End:
                    break
                if isinstance(item, str) and item:
                    await session.text(item)
            if session.open_utterance is None:  # nothing was said
                return
            await session.end()
            await player
        except ClientError as exc:
            reusable = False
            raise _api_error(exc) from exc
        except BaseException:
            if reusable:
                with contextlib.suppress(ClientError, OSError):
                    await session.cancel()  # an interruption: the server stops within one engine step
            raise
        finally:
            if player is not None:
                await utils.aio.cancel_and_wait(player)
            if reusable and not session.closed:
                self._pool.put(session)
            else:
                self._pool.remove(session)


async def _close(session: SpeechSession) -> None:
    await session.close()


async def _until_ready(configure: Awaitable[None], player: asyncio.Task[None]) -> None:
    """Await a ``configure`` (whose ``ready`` the player reads), or raise at once if the player failed first."""
    task = asyncio.ensure_future(configure)
    await asyncio.wait({task, player}, return_when=asyncio.FIRST_COMPLETED)
    if not task.done():
        await utils.aio.cancel_and_wait(task)
        player.result()  # raises the player's error
        raise ServerError("ended_early", "the connection stopped before its ready")
    task.result()


async def _play(session: SpeechSession, utterance: int, emitter: tts.AudioEmitter, segment_id: str | None) -> None:
    """Push the utterance's audio (16-bit PCM) and timed transcript to LiveKit until its ``done``."""
    started = False
    async for event in session.events():
        if event.utterance != utterance:
            continue  # another turn's late frames (one cancelled before this connection came back to the pool)
        if not started and segment_id is not None:
            emitter.start_segment(segment_id=segment_id)
        started = True
        if isinstance(event, Audio):
            emitter.push(event.pcm)
        elif isinstance(event, Words) and event.words:
            emitter.push_timed_transcript(
                [TimedString(f"{t.text} ", start_time=t.start_s, end_time=t.end_s) for t in word_timings(event)]
            )
        elif isinstance(event, Error):
            raise ServerError(event.code, event.message)
        elif isinstance(event, Done):
            if segment_id is not None:
                emitter.end_segment()
            else:
                emitter.flush()
            return


def _api_error(exc: ClientError) -> APIError:
    """LiveKit's error for a failed turn: a refusal that would repeat is a non-retryable status error."""
    if not is_permanent(exc):
        return APIConnectionError(str(exc))
    code = exc.code if isinstance(exc, ServerError) else ErrorCode.UNAUTHORIZED.value
    try:
        status = ErrorCode(code).http_status
    except ValueError:  # a code of a newer server
        status = None
    return APIStatusError(str(exc), status_code=status or 400, retryable=False)


class _ChunkedStream(tts.ChunkedStream):
    """``synthesize()``: the whole text as one utterance."""

    _tts: TTS
    """The TTS that made it (``TTS.synthesize``)."""

    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        voice = self._tts
        output_emitter.initialize(
            request_id=utils.shortuuid(), sample_rate=voice.sample_rate, num_channels=1, mime_type="audio/pcm"
        )
        if self.input_text.strip():
            await voice._speak(_one(self.input_text), output_emitter, None, self._conn_options.timeout)


class _SynthesizeStream(tts.SynthesizeStream):
    """``stream()``: text pushed as it comes is one utterance, ended by LiveKit's ``flush`` or end of input."""

    _tts: TTS
    """The TTS that made it (``TTS.stream``)."""

    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        voice = self._tts
        request_id = utils.shortuuid()
        output_emitter.initialize(
            request_id=request_id, sample_rate=voice.sample_rate, num_channels=1, mime_type="audio/pcm", stream=True
        )
        await voice._speak(self._texts(), output_emitter, request_id, self._conn_options.timeout)

    async def _texts(self) -> AsyncIterable[str | object]:
        async for item in self._input_ch:
            if isinstance(item, self._FlushSentinel):
                yield _End
                return
            self._mark_started()
            yield item


def _given_or(value: NotGivenOr[_T], old: _T) -> _T:
    """``value`` where ``update_options`` was given it, else the ``old`` setting."""
    return value if utils.is_given(value) else old


async def _one(text: str) -> AsyncIterable[str | object]:
    yield text
