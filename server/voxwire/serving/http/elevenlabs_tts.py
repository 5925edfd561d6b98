"""ElevenLabs' HTTP text-to-speech, so that its SDK, Pipecat's ``ElevenLabsHttpTTSService`` and LiveKit's
``elevenlabs.TTS.synthesize()`` work with only their URL changed:

* ``POST /v1/text-to-speech/{voice_id}`` and ``.../stream``: the audio in the query's ``output_format``, sent as it
  is generated (a chunked body: the first audio comes before the utterance is over; a client reading the whole
  body gets the whole file);
* ``.../with-timestamps``: one JSON object, ``audio_base64`` (the whole audio) with its characters' ``alignment``
  and ``normalized_alignment`` (the same: this server speaks the text as sent), times in seconds from the start;
* ``.../stream/with-timestamps``: newline-delimited JSON objects, each a block of audio in ``audio_base64`` with
  the characters timed since the previous object (or null), times in seconds from the start of the audio.

The body and query are ``http/elevenlabs_request.py``'s; the path's voice is read through the aliases
(``--voice-alias``) as every voice is. Admission, limits, metrics, the request id and the chunked stream are those
of ``POST /v1/audio/speech`` (``stream.stream_audio``).

Character timings are estimates (``serving/speech/alignment.py``), as on ElevenLabs' WebSocket here: ``WordTimer``
times each word from the audio produced so far (where the speech starts, the utterance's speaking rate) and
``Alignment.of_words`` shares a word's span among its characters by weight; a word is timed once the audio runs
past its estimated end, the last ones when the utterance ends. With ``voice_settings.speed`` the times are those
of the audio as sent (the tempo divides them).
"""

from __future__ import annotations

import base64
import contextlib
import json
import math
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

import numpy as np
from aiohttp import hdrs, web

from voxwire.engine import Chunk
from voxwire.serving.edge.admission import require_admission
from voxwire.serving.http.body import read_json, speech_body_limit
from voxwire.serving.http.elevenlabs_request import ElevenLabsSpeech, parse_body, parse_query
from voxwire.serving.http.inline_clip import inline_voice
from voxwire.serving.http.priority import request_priority
from voxwire.serving.http.stream import stream_audio
from voxwire.serving.runtime.keys import CONFIG_KEY, OWNER_KEY, SPEAKER_KEY, STATE_KEY, VOICES_KEY
from voxwire.serving.speech.alignment import Alignment, SpeakingRate, WordTimer, WordTiming, word_spans
from voxwire.serving.speech.persona_names import client_owner
from voxwire.serving.speech.service import SpeechJob, UtteranceOptions
from voxwire.serving.speech.voice_design import utterance_control
from voxwire.text.design import designed_text

TEXT_TO_SPEECH_PATH = "/v1/text-to-speech/{voice_id}"
TEXT_TO_SPEECH_STREAM_PATH = TEXT_TO_SPEECH_PATH + "/stream"
WITH_TIMESTAMPS_PATH = TEXT_TO_SPEECH_PATH + "/with-timestamps"
STREAM_WITH_TIMESTAMPS_PATH = TEXT_TO_SPEECH_STREAM_PATH + "/with-timestamps"

NDJSON = "application/x-ndjson"

LINE_AUDIO_BYTES = 32 * 1024
"""The most audio one line of ``stream/with-timestamps`` carries (a longer block goes on in the next lines):
Pipecat reads the lines with aiohttp's reader, which refuses a line over 128 KiB."""


@dataclass
class CharacterTimes:
    """Characters and their estimated times (seconds of the response's audio), as ElevenLabs' ``alignment``."""

    characters: list[str] = field(default_factory=list)
    starts_s: list[float] = field(default_factory=list)
    ends_s: list[float] = field(default_factory=list)

    def extend(self, more: CharacterTimes) -> None:
        self.characters += more.characters
        self.starts_s += more.starts_s
        self.ends_s += more.ends_s

    def take(self) -> CharacterTimes:
        """These times, leaving this empty."""
        taken = CharacterTimes(self.characters, self.starts_s, self.ends_s)
        self.characters, self.starts_s, self.ends_s = [], [], []
        return taken

    def to_json(self) -> dict[str, list[str] | list[float]] | None:
        """ElevenLabs' ``alignment`` object; None (JSON null) without characters."""
        if not self.characters:
            return None
        return {
            "characters": self.characters,
            "character_start_times_seconds": [round(t, 3) for t in self.starts_s],
            "character_end_times_seconds": [round(t, 3) for t in self.ends_s],
        }


class CharacterTimer:
    """An utterance's characters timed while its audio is produced: ``add`` each chunk of the model's audio and
    pass on the characters it times (those of the words ``WordTimer`` settles, and the spaces before them), then
    ``finish`` for the rest. Every character of the text is given out once, in order, times never decreasing."""

    def __init__(self, text: str, sample_rate: int, speed: float) -> None:
        self.text = text
        self._timer = WordTimer(text, sample_rate, SpeakingRate())
        self._spans = word_spans(text)
        self._speed = speed
        self._timed_words = 0
        self._last: WordTiming | None = None
        """The last word given out: the characters between it and the next word share the gap between them."""
        self._position = 0
        """How many of the text's characters have been given out."""

    def add(self, chunk: np.ndarray) -> CharacterTimes:
        """Measure the next ``chunk`` (shape ``(samples,)``, the model's rate); the characters it times."""
        return self._characters(self._timer.add(chunk), end=False)

    def finish(self) -> CharacterTimes:
        """The audio is complete: the characters not given out yet."""
        return self._characters(self._timer.finish(learn=False), end=True)

    def _characters(self, words: list[WordTiming], *, end: bool) -> CharacterTimes:
        if not words and not end:
            return CharacterTimes()
        # The text from the last word given out (so the gap after it is shared as Alignment.of_words shares it for
        # the whole text) to the end of the new words, or of the text.
        timed = [self._last, *words] if self._last is not None else words
        first = self._spans[self._timed_words - 1][0] if self._last is not None else 0
        self._timed_words += len(words)
        past = len(self.text) if end else self._spans[self._timed_words - 1][1]
        alignment = Alignment.of_words(self.text[first:past], timed, 0.0)
        new = self._position - first
        self._position, self._last = past, timed[-1]
        return CharacterTimes(
            list(alignment.text[new:]),
            [start / self._speed for start in alignment.starts_s[new:]],
            [end_s / self._speed for end_s in alignment.ends_s()[new:]],
        )


async def _timing(
    outputs: AsyncGenerator[Chunk, None], timer: CharacterTimer, timed: CharacterTimes
) -> AsyncGenerator[Chunk, None]:
    """``outputs``, adding the characters each one times to ``timed`` before it passes on."""
    async for output in outputs:
        timed.extend(timer.add(output.audio))
        if output.finished:
            timed.extend(timer.finish())
        yield output


def _timed_line(audio: bytes, timed: CharacterTimes) -> bytes:
    alignment = timed.to_json()
    line = {
        "audio_base64": base64.b64encode(audio).decode("ascii"),
        "alignment": alignment,
        "normalized_alignment": alignment,
    }
    return json.dumps(line, separators=(",", ":")).encode() + b"\n"


async def text_to_speech(request: web.Request) -> web.StreamResponse:
    """``POST /v1/text-to-speech/{voice_id}`` and ``.../stream``: the audio as it is generated."""
    return await _speak(request, timestamps=False, streamed=True)


async def with_timestamps(request: web.Request) -> web.StreamResponse:
    """``POST /v1/text-to-speech/{voice_id}/with-timestamps``: the whole audio, base64, with its timings."""
    return await _speak(request, timestamps=True, streamed=False)


async def stream_with_timestamps(request: web.Request) -> web.StreamResponse:
    """``POST /v1/text-to-speech/{voice_id}/stream/with-timestamps``: audio and timings, one JSON line a block."""
    return await _speak(request, timestamps=True, streamed=True)


async def _speak(request: web.Request, *, timestamps: bool, streamed: bool) -> web.StreamResponse:
    app = request.app
    require_admission(app, connection=False)
    config = app[CONFIG_KEY]
    output = parse_query(request.query)
    body = await read_json(request, config.limits.body_timeout_s, speech_body_limit(config))
    speech = parse_body(body, output, config)
    voices, service = app[VOICES_KEY], app[SPEAKER_KEY]
    voice = voices.resolve(request.match_info["voice_id"])  # a path naming no voice is 404 with a clip too
    if speech.ref_audio is not None:
        voice = await inline_voice(app, speech.ref_audio, speech.ref_text, field="ref_audio")
    # An OpenAI voice name (or an alias of one) designs its voice where the model can; no instructions come here.
    named = voices.canonical(request.match_info["voice_id"])
    text = designed_text(utterance_control(service.info, named, voice, None), speech.text)
    with app[STATE_KEY].utterance():
        owner = client_owner(request.get(OWNER_KEY), request.protocol)
        options = UtteranceOptions(
            playback_speed=speech.speed, owner=owner, max_ahead_s=math.inf, priority=request_priority(request, None)
        )
        job = SpeechJob(service.new_request_id("http"), text, speech.params, voice, options)
        outputs = service.speak(job)
        async with contextlib.aclosing(outputs):
            if not timestamps:
                return await _stream_audio(request, speech, outputs)
            timer = CharacterTimer(speech.text, service.info.sample_rate, speech.speed)
            timed = CharacterTimes()
            async with contextlib.aclosing(_timing(outputs, timer, timed)) as timing:
                if streamed:
                    return await _stream_lines(request, speech, timing, timed)
                return await _whole_with_timestamps(request, speech, timing, timed)


async def _stream_audio(
    request: web.Request, speech: ElevenLabsSpeech, outputs: AsyncGenerator[Chunk, None]
) -> web.StreamResponse:
    encoder = speech.output.encoder(request.app[SPEAKER_KEY].info.sample_rate, speech.speed)
    response, _ = await stream_audio(request, outputs, encoder, {hdrs.CONTENT_TYPE: encoder.content_type})
    await response.write_eof()
    return response


async def _stream_lines(
    request: web.Request, speech: ElevenLabsSpeech, outputs: AsyncGenerator[Chunk, None], timed: CharacterTimes
) -> web.StreamResponse:
    """Each encoded block as JSON lines with the characters timed since the last line; any left at the end in a
    line of their own."""

    def lines(block: bytes) -> bytes:
        pieces = [block[at : at + LINE_AUDIO_BYTES] for at in range(0, len(block), LINE_AUDIO_BYTES)]
        first, *rest = pieces
        return _timed_line(first, timed.take()) + b"".join(_timed_line(piece, CharacterTimes()) for piece in rest)

    encoder = speech.output.encoder(request.app[SPEAKER_KEY].info.sample_rate, speech.speed)
    response, _ = await stream_audio(request, outputs, encoder, {hdrs.CONTENT_TYPE: NDJSON}, lines)
    if timed.characters:
        await response.write(_timed_line(b"", timed.take()))
    await response.write_eof()
    return response


async def _whole_with_timestamps(
    request: web.Request, speech: ElevenLabsSpeech, outputs: AsyncGenerator[Chunk, None], timed: CharacterTimes
) -> web.StreamResponse:
    """The audio gathered, then one JSON object (the response starts with the first audio, as every speech
    response does, so that an utterance that fails at once gets its error status)."""
    audio = bytearray()

    def gather(block: bytes) -> bytes:
        audio.extend(block)
        return b""  # sent at the end, in the JSON object

    encoder = speech.output.encoder(request.app[SPEAKER_KEY].info.sample_rate, speech.speed)
    response, _ = await stream_audio(request, outputs, encoder, {hdrs.CONTENT_TYPE: "application/json"}, gather)
    alignment = timed.to_json()
    body = {"audio_base64": base64.b64encode(audio).decode("ascii"), "alignment": alignment}
    await response.write(json.dumps({**body, "normalized_alignment": alignment}).encode())
    await response.write_eof()
    return response


def add_elevenlabs_tts_routes(app: web.Application) -> None:
    app.router.add_post(TEXT_TO_SPEECH_PATH, text_to_speech)
    app.router.add_post(TEXT_TO_SPEECH_STREAM_PATH, text_to_speech)
    app.router.add_post(WITH_TIMESTAMPS_PATH, with_timestamps)
    app.router.add_post(STREAM_WITH_TIMESTAMPS_PATH, stream_with_timestamps)
