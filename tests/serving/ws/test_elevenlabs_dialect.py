"""ElevenLabs' endpoints as a dialect of the one ``SessionCore``, without a socket, an event loop or an engine: their
frames go in as JSON text, ours come out as the core's actions (read as ``test_session_core.py`` reads them); and
``ElevenLabsSocket`` turns our typed events into their messages on a socket that only records what it is given."""

from __future__ import annotations

import base64
import json
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from voxwire.audio.elevenlabs_formats import parse_output_format
from voxwire.finish_reason import FinishReason
from voxwire.protocol.error_codes import ErrorCode
from voxwire.protocol.wire import AudioFrame, CloseCode, Done, Error, Ready, Segment, Start, Words
from voxwire.serving.runtime.encoding import INLINE
from voxwire.serving.ws.elevenlabs import ElevenLabsSocket, Endpoint
from voxwire.serving.ws.elevenlabs_dialect import SESSION_FORMAT, ElevenLabsDialect
from voxwire.serving.ws.elevenlabs_protocol import parse_client
from voxwire.serving.ws.session_core import (
    Action,
    Announce,
    CloseSocket,
    FinishAudio,
    OpenUtterance,
    SendClose,
    SendContextEnd,
    SendDone,
    SendError,
    SessionCore,
    SessionPhase,
    SpeakSegment,
    StopAll,
    StopUtterance,
)
from voxwire.serving.ws.utterance import Settings

from .helpers import LIMITS, Gate, resolve


def new_core(*, multi: bool = True, voice: str = "default", seed: int | None = None, **limits: Any) -> SessionCore:
    dialect = ElevenLabsDialect(voice, seed, multi=multi)
    core = SessionCore(replace(LIMITS, **limits), resolve, Gate(), now=0.0, dialect=dialect)
    core.opened()
    return core


def say(core: SessionCore, at: float = 0.0, **message: Any) -> list[Action]:
    """One ElevenLabs client message."""
    return core.receive(json.dumps(message), at)


def context_settings(seed: int | None = None) -> Settings:
    """What a context of the path's voice (``default``) is spoken with: the model's samples, to re-encode."""
    return resolve(Start(voice="default", format=SESSION_FORMAT, seed=seed))


def refusal(actions: list[Action]) -> SendError:
    """The one ``error`` an event was answered with (and nothing else)."""
    assert len(actions) == 1 and isinstance(actions[0], SendError), actions
    return actions[0]


# ---- contexts ------------------------------------------------------------------------------------------------------


def test_the_first_text_opens_a_context_with_the_paths_voice_and_seed_and_a_space_alone_says_nothing() -> None:
    core = new_core(seed=7)
    settings = context_settings(seed=7)
    assert say(core, text=" ", context_id="a") == [Announce(settings, "a")]
    assert say(core, text="Hello there. How", context_id="a") == [
        OpenUtterance(0, settings, "a"), SpeakSegment(0, 0, "Hello there."),
    ]  # fmt: skip


def test_voice_settings_speed_on_a_contexts_first_message_is_its_speed_and_the_other_settings_change_nothing() -> None:
    starts: list[Start] = []

    def recording(start: Start) -> Settings:
        starts.append(start)
        return resolve(start)

    core = SessionCore(LIMITS, recording, Gate(), now=0.0, dialect=ElevenLabsDialect("default", None, multi=True))
    core.opened()
    starts.clear()  # the default context's settings
    settings = {"speed": 1.2, "stability": 0.3, "similarity_boost": 0.9, "style": 0.1, "use_speaker_boost": True}
    say(core, text=" ", context_id="a", voice_settings=settings)
    say(core, text="Hello.", context_id="a", voice_settings={"speed": 0.8})  # not a first message: no new start
    say(core, text=" ", context_id="b", voice_settings={"stability": 0.3})
    assert [(start.context_id, start.speed) for start in starts] == [("a", 1.2), ("b", None)]


@pytest.mark.parametrize(
    ("speed", "code"),
    [(0.69, ErrorCode.OUT_OF_RANGE), (1.21, ErrorCode.OUT_OF_RANGE), ("fast", ErrorCode.INVALID_FIELD),
     (True, ErrorCode.INVALID_FIELD)],
)  # fmt: skip
def test_a_speed_outside_elevenlabs_range_is_refused_and_opens_nothing(speed: object, code: ErrorCode) -> None:
    core = new_core()
    refused = refusal(say(core, text=" ", context_id="a", voice_settings={"speed": speed}))
    assert refused.code is code and "voice_settings.speed" in refused.message
    assert not core.started("a")


@pytest.mark.parametrize("field", ["xi_api_key", "xi-api-key"])
def test_the_first_messages_key_is_read_with_either_spelling(field: str) -> None:
    assert parse_client(json.dumps({"text": " ", field: "sk-1"})).api_key == "sk-1"


def test_a_message_without_a_context_id_speaks_in_the_context_named_default() -> None:
    core = new_core()
    assert say(core, text="Hi.", flush=True)[-1] == SpeakSegment(0, 0, "Hi.")
    assert core.open_utterance("default") and not core.open_utterance(None)


@pytest.mark.parametrize("end_of_turn", [{"flush": True}, {"text": "", "flush": True}], ids=["pipecat", "livekit"])
def test_close_context_after_the_turns_end_speaks_it_to_its_end_then_the_context_is_over_and_its_id_free(
    end_of_turn: dict[str, Any],
) -> None:
    core = new_core()
    say(core, text="One. Two", context_id="a")
    say(core, context_id="a", **end_of_turn)  # a flush with no text of its own: the turn's text is all given
    assert say(core, context_id="a", close_context=True) == []  # "One." is on the service; "Two" waits its turn
    assert core.segment_spoken(0, FinishReason.STOP) == [SpeakSegment(0, 1, "Two")]
    assert core.segment_spoken(0, FinishReason.STOP) == [FinishAudio(0)]
    assert core.audio_finished(0, now=1.0) == [SendDone(0, FinishReason.STOP)]
    assert core.done_sent(0) == [SendContextEnd("a")]
    assert not core.started("a")
    assert say(core, text="Again.", context_id="a", flush=True) == [
        Announce(context_settings(), "a"), OpenUtterance(1, context_settings(), "a"), SpeakSegment(1, 0, "Again."),
    ]  # fmt: skip


def test_close_context_after_sentences_flushed_as_they_were_sent_cancels_what_is_not_spoken() -> None:
    core = new_core()
    say(core, text="One. ", context_id="a", flush=True)  # LiveKit sends each sentence with flush
    say(core, text="Two. ", context_id="a", flush=True)
    assert say(core, context_id="a", close_context=True) == [StopUtterance(0), SendDone(0, FinishReason.CANCELLED)]
    assert core.done_sent(0) == [SendContextEnd("a")]


def test_close_context_with_text_after_the_last_flush_cancels_the_turn() -> None:
    core = new_core()
    say(core, text="Hello there. And then", context_id="a")  # a barge-in: the turn was not all given
    assert say(core, context_id="a", close_context=True) == [StopUtterance(0), SendDone(0, FinishReason.CANCELLED)]
    assert core.done_sent(0) == [SendContextEnd("a")]


def test_a_context_closed_a_second_time_while_it_speaks_is_cancelled() -> None:
    core = new_core()
    say(core, text="Hello there.", context_id="a")
    say(core, context_id="a", flush=True)
    assert say(core, context_id="a", close_context=True) == []
    assert say(core, context_id="a", close_context=True) == [StopUtterance(0), SendDone(0, FinishReason.CANCELLED)]


def test_a_context_with_nothing_to_say_ends_at_once_and_messages_that_open_nothing_change_nothing() -> None:
    core = new_core()
    say(core, text=" ", context_id="empty")
    assert say(core, context_id="empty", close_context=True) == [SendContextEnd("empty")]
    assert say(core, context_id="never", close_context=True) == []
    assert say(core, text="", context_id="later") == []
    assert say(core, text="Hi.", context_id="closed-at-once", close_context=True) == []
    assert not core.started("later") and not core.started("closed-at-once")


def test_a_closed_context_refuses_text_until_it_is_over() -> None:
    core = new_core()
    say(core, text="Hello there.", context_id="a")
    say(core, context_id="a", flush=True)
    say(core, context_id="a", close_context=True)
    refused = refusal(say(core, text="One more thing.", context_id="a"))
    assert (refused.code, refused.context_id) == (ErrorCode.INVALID_MESSAGE, "a") and "closed" in refused.message
    assert say(core, text=" ", context_id="a") == [], "whitespace to a closed context is not worth an error"


def test_live_contexts_are_bounded_by_max_queued_utterances_and_a_refused_one_reads_no_further() -> None:
    core = new_core(max_queued_utterances=1)
    say(core, text=" ", context_id="one")
    refused = refusal(say(core, text="Hello.", context_id="two", flush=True))
    assert (refused.code, refused.context_id) == (ErrorCode.TOO_MANY_UTTERANCES, "two")
    assert say(core, text="Still here.", context_id="one")[0] == OpenUtterance(0, context_settings(), "one")


@pytest.mark.parametrize("multi", [True, False], ids=["multi-stream-input", "stream-input"])
def test_a_voice_deleted_since_the_upgrade_refuses_each_context_and_its_text_is_not_spoken(multi: bool) -> None:
    core = new_core(multi=multi, voice="nobody")
    context_id = "a" if multi else None
    for _ in range(2):
        refused = refusal(say(core, text="Hello there.", context_id="a", flush=True))
        assert (refused.code, refused.context_id) == (ErrorCode.UNKNOWN_VOICE, context_id)
    assert core.utterances == []


# ---- the end of the input ------------------------------------------------------------------------------------------


def test_close_socket_ends_each_context_its_way_then_closes_after_the_last_is_over() -> None:
    core = new_core()
    say(core, text="A one.", context_id="a", flush=True)
    say(core, text="B one. More", context_id="b")
    assert say(core, close_socket=True) == [StopUtterance(1), SendDone(1, FinishReason.CANCELLED)]
    assert core.phase is SessionPhase.ENDING
    assert say(core, text="Too late.", context_id="c") == [], "nothing is taken once the input ended"
    assert core.done_sent(1) == [SendContextEnd("b")]
    assert core.segment_spoken(0, FinishReason.STOP) == [FinishAudio(0)]
    assert core.audio_finished(0, now=1.0) == [SendDone(0, FinishReason.STOP)]
    assert core.done_sent(0) == [SendContextEnd("a"), SendClose()]
    assert core.phase is SessionPhase.CLOSED and core.deadline is None


def test_close_socket_with_nothing_live_closes_at_once() -> None:
    core = new_core()
    assert say(core, close_socket=True) == [SendClose()]


def test_stream_input_speaks_its_one_context_to_the_end_of_input_and_the_socket_closes_with_it() -> None:
    core = new_core(multi=False)
    settings = context_settings()
    assert say(core, text="Hello there. The end", context_id="ignored") == [
        Announce(settings, None), OpenUtterance(0, settings, None), SpeakSegment(0, 0, "Hello there."),
    ]  # fmt: skip
    assert say(core, text="") == []  # the end of input: the rest is flushed and spoken
    assert core.segment_spoken(0, FinishReason.STOP) == [SpeakSegment(0, 1, "The end")]
    assert core.segment_spoken(0, FinishReason.STOP) == [FinishAudio(0)]
    assert core.audio_finished(0, now=1.0) == [SendDone(0, FinishReason.STOP)]
    assert core.done_sent(0) == [SendContextEnd(None), SendClose()]


def test_stream_inputs_socket_closes_once_its_context_failed() -> None:
    core = new_core(multi=False)
    say(core, text="Hello there.")
    failed = core.segment_failed(0, ErrorCode.SYNTHESIS_FAILED, "non-finite latents", now=1.0)
    assert failed == [SendError(ErrorCode.SYNTHESIS_FAILED, "non-finite latents", 0), SendDone(0, FinishReason.ERROR)]
    assert core.done_sent(0) == [SendContextEnd(None), SendClose()]


# ---- the core's limits, once per client message ------------------------------------------------------------------


def test_one_client_message_spends_one_message_of_the_budget() -> None:
    core = new_core(max_messages_per_s=2.0)
    for text in ("One. ", "Two. "):  # each a start or text, and a flush, of ours
        assert not [a for a in say(core, at=1.0, text=text, context_id="a", flush=True) if isinstance(a, SendError)]
    assert say(core, at=1.0, text="Three. ", context_id="a") == [
        StopAll("rate_limited"), CloseSocket(CloseCode.RATE_LIMITED, "rate_limited: more than 2 messages per second"),
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("raw", "code"),
    [("not json", ErrorCode.INVALID_JSON), ('{"text": 5}', ErrorCode.INVALID_FIELD),
     (json.dumps({"text": "x" * 2000}), ErrorCode.MESSAGE_TOO_LARGE)],
)  # fmt: skip
def test_a_frame_that_is_not_a_message_is_refused_with_no_context(raw: str, code: ErrorCode) -> None:
    core = new_core()
    refused = refusal(core.receive(raw, 0.0))
    assert (refused.code, refused.context_id) == (code, None)


def test_a_keep_alive_restarts_the_idle_clock() -> None:
    core = new_core(idle_timeout_s=10.0)
    say(core, at=0.0, text=" ", context_id="quiet")
    assert say(core, at=8.0, text="") == [] and core.deadline == 18.0


# ---- out: our events as their messages -----------------------------------------------------------------------------


class RecordingWebSocket:
    """What ``ElevenLabsSocket`` writes, as the client would parse it."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    async def send_str(self, data: str) -> None:
        self.sent.append(json.loads(data))


RATE = 16000


def elevenlabs_socket(output_format: str = "pcm_16000", *, context_times: bool = False) -> ElevenLabsSocket:
    endpoint = Endpoint(True, "default", parse_output_format(output_format), None, context_times, True)
    return ElevenLabsSocket(RecordingWebSocket(), None, endpoint, RATE, INLINE)  # type: ignore[arg-type]


def sent(socket: ElevenLabsSocket) -> list[dict[str, Any]]:
    ws = socket.ws
    assert isinstance(ws, RecordingWebSocket)
    return ws.sent


def samples_frame(samples: np.ndarray, sequence: int, context_id: str | None) -> AudioFrame:
    return AudioFrame(SESSION_FORMAT, 0, sequence, (samples.astype("<f4").tobytes(),), context_id)


async def speak_a_sentence(socket: ElevenLabsSocket, context_id: str | None, start_s: float = 0.0) -> np.ndarray:
    """Sentence 0 of an utterance: 0.25 s of audio, its two words timed on the utterance's timeline."""
    audio = np.full(RATE // 4, 0.25, dtype=np.float32)
    await socket.send(Segment(0, 0, "Hi there.", round(start_s * RATE), "Hi there.", context_id))
    await socket.send_frame(samples_frame(audio, 0, context_id), "binary")
    await socket.send(Words(0, 0, ("Hi", "there."), (start_s + 0.05, start_s + 0.1), (start_s + 0.09, start_s + 0.2),
                            context_id))  # fmt: skip
    return audio


@pytest.mark.asyncio
async def test_a_sentences_audio_is_re_encoded_then_timed_from_its_words_then_the_context_is_final() -> None:
    socket = elevenlabs_socket("pcm_16000")
    audio = await speak_a_sentence(socket, "a")
    await socket.send(Done(0, "stop", 1, 0.25, None, None, None, "a"))
    await socket.end_context("a")
    heard, timed, final = sent(socket)
    pcm = np.frombuffer(base64.b64decode(heard["audio"]), dtype="<i2")
    assert pcm.size == audio.size and heard["contextId"] == "a" and heard["alignment"] is None
    alignment = timed["alignment"]
    assert "".join(alignment["chars"]) == "Hi there. " and timed["audio"] == ""
    starts, durations = alignment["charStartTimesMs"], alignment["charDurationsMs"]
    assert starts[0] == 50 and starts[3] == 100, "each word starts where its timing says"
    assert starts[-1] + durations[-1] == 250, "the trailing space ends with the sentence's audio"
    assert timed["normalizedAlignment"] == alignment
    assert final == {"isFinal": True, "contextId": "a"}


@pytest.mark.asyncio
@pytest.mark.parametrize(("context_times", "first_ms"), [(False, 50), (True, 1050)])
async def test_alignment_counts_from_the_sentence_or_with_sync_alignment_from_the_context(
    context_times: bool, first_ms: int
) -> None:
    socket = elevenlabs_socket(context_times=context_times)
    await speak_a_sentence(socket, None, start_s=1.0)
    await socket.send(Done(0, "stop", 1, 1.25, None, None, None))
    _, timed = sent(socket)
    assert "contextId" not in timed and timed["alignment"]["charStartTimesMs"][0] == first_ms


@pytest.mark.asyncio
async def test_a_sentence_cut_short_gets_no_timings_and_errors_keep_their_context() -> None:
    socket = elevenlabs_socket()
    await socket.send(Ready(1, "tiny", SESSION_FORMAT, RATE, 0.08, 0, "default", None, 2.0, 10, 500, 400, None))
    await speak_a_sentence(socket, "a")
    await socket.send(Error("synthesis_failed", "non-finite latents", 0, context_id="a"))
    await socket.send(Done(0, "error", 1, 0.25, None, None, None, "a"))
    heard, error = sent(socket)
    assert "audio" in heard and error == {
        "error": "synthesis_failed",
        "message": "non-finite latents",
        "contextId": "a",
    }
