"""``SessionCore`` alone: no socket, no event loop, no engine. Time is a number the test passes, so text buffering,
the buffer-delay flush, idleness and the message budget are exact; the utterance lifecycle is read off the actions
each event returns, and every refusal off its error code."""

from __future__ import annotations

import pytest

from voxwire.finish_reason import FinishReason
from voxwire.protocol.error_codes import ErrorCode
from voxwire.protocol.wire import Cancel, CloseCode, End, Flush, Start, Text, encode
from voxwire.serving.ws.session_core import (
    Action,
    Announce,
    CloseSocket,
    FinishAudio,
    OpenUtterance,
    Preload,
    SendDone,
    SendError,
    SessionPhase,
    SpeakSegment,
    StopAll,
    StopUtterance,
)
from voxwire.serving.ws.utterance import UtteranceStatus

from .helpers import DELAY_S, LIMITS, Gate, new_core, send


def refusal(actions: list[Action]) -> ErrorCode:
    """The code of the one ``error`` an event was answered with (and nothing else)."""
    assert len(actions) == 1 and isinstance(actions[0], SendError), actions
    assert actions[0].utterance is None and actions[0].message
    return actions[0].code


# ---- text buffering by the clock -----------------------------------------------------------------------------------


def test_a_complete_sentence_speaks_at_once_and_the_rest_waits_for_the_deadline() -> None:
    core = new_core()
    actions = send(core, Text("One is here. Two"), at=10.0)
    assert actions == [OpenUtterance(0, core.settings), SpeakSegment(0, 0, "One is here.")]
    assert core.deadline == pytest.approx(10.0 + DELAY_S)
    assert core.tick(10.0 + DELAY_S - 0.001) == []
    assert core.segment_spoken(0, FinishReason.STOP) == []  # "Two" is still buffered
    assert core.tick(10.0 + DELAY_S) == [SpeakSegment(0, 1, "Two")]
    assert core.deadline == 10.0 + LIMITS.idle_timeout_s, "only the idle limit is left to wait for"


def test_the_deadline_is_the_first_buffered_characters_not_the_latest() -> None:
    core = new_core()
    send(core, Text("Waiting"), at=1.0)
    send(core, Text(" for more"), at=1.2)
    assert core.deadline == pytest.approx(1.0 + DELAY_S)
    assert core.tick(1.0 + DELAY_S) == [SpeakSegment(0, 0, "Waiting for more")]


def test_a_zero_delay_speaks_each_text_at_once_and_flush_speaks_the_rest_now() -> None:
    core = new_core()
    send(core, Start(max_buffer_delay_ms=0))
    assert send(core, Text("No full stop"))[-1] == SpeakSegment(0, 0, "No full stop")

    core = new_core()
    send(core, Text("No full stop"))
    assert send(core, Flush()) == [SpeakSegment(0, 0, "No full stop")]
    assert core.deadline == LIMITS.idle_timeout_s


def test_text_with_no_letter_or_digit_is_not_spoken() -> None:
    core = new_core()
    assert send(core, Text("... !")) == [OpenUtterance(0, core.settings)]
    assert send(core, Flush()) == []
    assert refusal(send(core, End())) is ErrorCode.EMPTY_UTTERANCE


# ---- the utterance lifecycle ---------------------------------------------------------------------------------------


def test_an_utterance_speaks_its_segments_in_order_then_its_tail_then_done_and_is_released() -> None:
    gate = Gate()
    core = new_core(gate)
    send(core, Text("One is here. Two is here. Three"))
    (utterance,) = core.utterances
    assert gate.live == 1 and utterance.status is UtteranceStatus.OPEN
    assert send(core, End()) == []  # segment 0 is still on the service; the rest waits its turn
    assert utterance.status is UtteranceStatus.ENDED
    assert core.segment_spoken(0, FinishReason.STOP) == [SpeakSegment(0, 1, "Two is here.")]
    assert core.segment_spoken(0, None) == [SpeakSegment(0, 1, "Three")], "normalized to nothing: no index taken"
    assert core.segment_spoken(0, FinishReason.STOP) == [FinishAudio(0)]
    assert core.audio_finished(0, now=5.0) == [SendDone(0, FinishReason.STOP)]
    assert utterance.status is UtteranceStatus.FINISHED and gate.live == 1, "live until its done is sent"
    core.done_sent(0)
    assert utterance.status is UtteranceStatus.RELEASED and core.utterances == [] and gate.live == 0


def test_a_segment_cut_at_its_length_cap_finishes_the_utterance_with_length() -> None:
    core = new_core()
    send(core, Text("One is here. Two is here."))
    send(core, End())
    core.segment_spoken(0, FinishReason.LENGTH)
    core.segment_spoken(0, FinishReason.STOP)
    assert core.audio_finished(0, now=1.0) == [SendDone(0, FinishReason.LENGTH)]


def test_utterances_follow_each_other() -> None:
    core = new_core()
    send(core, Text("First one."))
    send(core, End())
    assert send(core, Text("Second one.")) == [OpenUtterance(1, core.settings)], "it waits for utterance 0"
    assert send(core, End()) == []
    assert core.segment_spoken(0, FinishReason.STOP) == [FinishAudio(0)]
    assert core.audio_finished(0, now=1.0) == [SendDone(0, FinishReason.STOP), SpeakSegment(1, 0, "Second one.")]


def test_settings_apply_to_the_utterances_opened_after_the_start() -> None:
    core = new_core()
    ready = send(core, Start(seed=7, normalize=True))
    assert ready == [Preload(), Announce(core.settings)] and core.settings.params.seed == 7
    assert send(core, Text("Hi."))[0] == OpenUtterance(0, core.settings)


def test_a_failed_segment_ends_its_utterance_in_error_drops_its_text_and_the_next_one_speaks() -> None:
    core = new_core()
    send(core, Text("One is here. Two is here."))
    send(core, End())
    send(core, Text("Next one. And buffered"))
    failed = core.segment_failed(0, ErrorCode.SYNTHESIS_FAILED, "non-finite latents", now=2.0)
    assert failed == [
        SendError(ErrorCode.SYNTHESIS_FAILED, "non-finite latents", 0),
        SendDone(0, FinishReason.ERROR),
        SpeakSegment(1, 0, "Next one."),
    ]
    assert core.segment_failed(1, ErrorCode.BUSY, "at capacity", now=3.0)[1:] == [SendDone(1, FinishReason.ERROR)]
    assert [u.status for u in core.utterances] == [UtteranceStatus.FINISHED] * 2
    assert send(core, Text("Fresh."))[0] == OpenUtterance(2, core.settings), "the buffered words are not prepended"


def test_cancel_stops_every_live_utterance_and_drops_buffered_text() -> None:
    core = new_core()
    send(core, Text("First one."))
    send(core, End())
    send(core, Text("Second one. Buffered"))
    assert send(core, Cancel()) == [
        StopUtterance(0), SendDone(0, FinishReason.CANCELLED), StopUtterance(1), SendDone(1, FinishReason.CANCELLED),
    ]  # fmt: skip
    assert core.deadline == LIMITS.idle_timeout_s
    assert core.segment_spoken(0, FinishReason.STOP) == [], "a report about a cancelled utterance is moot"
    assert send(core, Cancel()) == [], "nothing to stop: harmless"


# ---- refusals --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        pytest.param("{not json", ErrorCode.INVALID_JSON, id="malformed JSON"),
        pytest.param('{"type":"speak"}', ErrorCode.UNKNOWN_TYPE, id="unknown type"),
        pytest.param(encode(Text("é" * 600)), ErrorCode.MESSAGE_TOO_LARGE, id="over max_message_bytes"),
        pytest.param(encode(Text("x" * 101)), ErrorCode.TEXT_TOO_LONG, id="over the per-message limit"),
        pytest.param(encode(Start(voice="nobody")), ErrorCode.UNKNOWN_VOICE, id="a start the server refuses"),
        pytest.param(encode(End()), ErrorCode.EMPTY_UTTERANCE, id="end with no text"),
    ],
)
def test_each_bad_message_gets_its_code_and_changes_nothing(raw: str, code: ErrorCode) -> None:
    core = new_core()
    settings = core.settings
    assert refusal(core.receive(raw, 0.0)) is code
    assert (core.settings, core.utterances, core.phase) == (settings, [], SessionPhase.ACTIVE)


def test_a_typed_message_is_handled_as_its_frame_would_be_and_kept_to_the_same_rules() -> None:
    core = new_core()
    assert core.handle(Text("One is here. Two"), 0.0) == [
        OpenUtterance(0, core.settings),
        SpeakSegment(0, 0, "One is here."),
    ]
    assert refusal(core.handle(Start(format="mp3"), 0.0)) is ErrorCode.OUT_OF_RANGE, "a start decode_client refuses"
    assert refusal(core.handle(Text("x", context_id=""), 0.0)) is ErrorCode.OUT_OF_RANGE
    assert list(core.contexts) == [None]


def test_messages_the_state_does_not_allow_are_refused() -> None:
    gate = Gate()
    core = new_core(gate)
    assert refusal(core.receive_binary(0.0)) is ErrorCode.BINARY_FRAME
    send(core, Text("x" * 100))
    assert refusal(send(core, Start(seed=1))) is ErrorCode.UTTERANCE_IN_PROGRESS
    assert refusal(send(core, Text("x" * 51))) is ErrorCode.UTTERANCE_TOO_LONG
    send(core, End())
    send(core, Text("Second."))
    send(core, End())
    assert refusal(send(core, Text("Third."))) is ErrorCode.TOO_MANY_UTTERANCES
    gate.accepting = False
    core.segment_spoken(0, FinishReason.STOP)
    core.audio_finished(0, now=1.0)
    assert refusal(send(core, Text("Third."))) is ErrorCode.UNAVAILABLE


def test_a_flood_past_the_message_budget_closes_the_connection() -> None:
    core = new_core(max_messages_per_s=5.0)
    for _ in range(5):
        send(core, Flush(), at=1.0)
    assert send(core, Flush(), at=1.0) == [
        StopAll("rate_limited"), CloseSocket(CloseCode.RATE_LIMITED, "rate_limited: more than 5 messages per second"),
    ]  # fmt: skip
    assert core.phase is SessionPhase.CLOSED and core.deadline is None
    assert send(core, Text("Too late."), at=9.0) == [] and core.receive_binary(9.0) == []


def test_the_budget_refills_with_time() -> None:
    core = new_core(max_messages_per_s=5.0)
    for second in range(20):
        for _ in range(5):
            assert send(core, Flush(), at=float(second)) == []
    assert core.phase is SessionPhase.ACTIVE


# ---- idleness and the end of the connection --------------------------------------------------------------------------


def test_a_connection_with_no_message_and_no_audio_for_the_idle_limit_is_closed() -> None:
    core = new_core(idle_timeout_s=10.0)
    send(core, Text("Speak."), at=1.0)
    send(core, Flush(), at=1.0)
    core.audio_produced(8.0)
    assert core.deadline == 18.0 and core.tick(17.9) == []
    assert core.tick(18.0) == [
        StopAll("idle_timeout"), CloseSocket(CloseCode.IDLE_TIMEOUT, "idle_timeout: nothing sent or spoken for 10 s"),
    ]  # fmt: skip
    assert core.utterances == [] and core.tick(99.0) == []


def test_shut_releases_everything_and_cuts_the_reason_to_a_close_frame() -> None:
    gate = Gate()
    core = new_core(gate)
    send(core, Text("Speak."))
    actions = core.shut(CloseCode.SLOW_CONSUMER, "slow_consumer", "é" * 100)
    assert actions[0] == StopAll("slow_consumer") and gate.live == 0
    close = actions[1]
    assert isinstance(close, CloseSocket) and close.code == CloseCode.SLOW_CONSUMER
    assert close.reason.startswith("slow_consumer: é") and len(close.reason.encode()) <= 123
    assert core.shut(CloseCode.INTERNAL_ERROR, "internal_error", "again") == [], "one close only"


@pytest.mark.parametrize(("speaking", "dropped"), [(True, "client_gone"), (False, None)])
def test_a_client_that_leaves_is_counted_as_dropped_only_mid_utterance(speaking: bool, dropped: str | None) -> None:
    gate = Gate()
    core = new_core(gate)
    if speaking:
        send(core, Text("Speak."))
    assert core.disconnected() == [StopAll(dropped)]
    assert core.phase is SessionPhase.CLOSED and gate.live == 0
