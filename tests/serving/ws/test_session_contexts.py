"""Several contexts on one connection, in ``SessionCore`` alone (no socket, no event loop, no engine): each context
has its own settings, text buffer, deadline, utterances and cancel; contexts speak side by side; the number of
named contexts is bounded; a message without ``context_id`` addresses the default context as it always did."""

from __future__ import annotations

from dataclasses import replace

import pytest

from voxwire.finish_reason import FinishReason
from voxwire.protocol.error_codes import ErrorCode
from voxwire.protocol.wire import Cancel, CloseContext, End, Flush, Start, Text
from voxwire.serving.ws.session_core import (
    Announce,
    FinishAudio,
    OpenUtterance,
    SendDone,
    SendError,
    SessionCore,
    SpeakSegment,
    StopUtterance,
)
from voxwire.serving.ws.utterance import Settings, UtteranceStatus

from .helpers import DELAY_S, LIMITS, Gate, new_core, resolve, send


def test_each_context_has_its_own_settings_and_the_default_context_keeps_its_own() -> None:
    core = new_core()
    default = core.settings
    (announce,) = send(core, Start(seed=5, format="pcm_s16le", context_id="b"))
    assert isinstance(announce, Announce) and announce.context_id == "b"
    assert (announce.settings.params.seed, announce.settings.format) == (5, "pcm_s16le")
    assert core.settings == default, "a context's start leaves the default context's settings alone"
    opened_b = send(core, Text("Hi. Then", context_id="b"))
    opened_default = send(core, Text("Hello. Then"))
    assert opened_b == [OpenUtterance(0, announce.settings, "b"), SpeakSegment(0, 0, "Hi.")]
    assert opened_default == [OpenUtterance(1, default, None), SpeakSegment(1, 0, "Hello.")]


def test_a_new_context_starts_from_the_server_defaults_not_from_the_default_context() -> None:
    core = new_core()
    defaults = core.settings
    send(core, Start(seed=9))
    (opened,) = send(core, Text("Hi.", context_id="c"))
    assert opened == OpenUtterance(0, defaults, "c")


def test_contexts_speak_side_by_side_and_each_keeps_its_own_order() -> None:
    core = new_core(max_queued_utterances=8)
    send(core, Text("A one. A two.", context_id="a"))
    send(core, End(context_id="a"))
    send(core, Text("B one.", context_id="b"))
    send(core, End(context_id="b"))
    assert send(core, Text("A again. More", context_id="a")) == [OpenUtterance(2, core.contexts["a"].settings, "a")]
    # utterance 0 (context a) and utterance 1 (context b) are both on the service; a's next waits for a's first
    assert core.segment_spoken(1, FinishReason.STOP) == [FinishAudio(1)]
    assert core.segment_spoken(0, FinishReason.STOP) == [SpeakSegment(0, 1, "A two.")]
    assert core.audio_finished(1, now=1.0) == [SendDone(1, FinishReason.STOP)]
    assert core.segment_spoken(0, FinishReason.STOP) == [FinishAudio(0)]
    assert core.audio_finished(0, now=2.0) == [SendDone(0, FinishReason.STOP), SpeakSegment(2, 0, "A again.")]


def test_cancel_stops_only_its_context() -> None:
    core = new_core(max_queued_utterances=8)
    send(core, Text("A speaks.", context_id="a"))
    send(core, Text("B speaks. B buffered", context_id="b"))
    send(core, Text("Default speaks."))
    assert send(core, Cancel(context_id="b")) == [StopUtterance(1), SendDone(1, FinishReason.CANCELLED)]
    assert [u.status for u in core.utterances] == [UtteranceStatus.OPEN, UtteranceStatus.FINISHED, UtteranceStatus.OPEN]
    assert send(core, Cancel()) == [StopUtterance(2), SendDone(2, FinishReason.CANCELLED)], "the default context only"
    assert send(core, End(context_id="a")) == [SpeakSegment(0, 0, "A speaks.")], "context a goes on untouched"
    assert send(core, Text(" more.", context_id="b"))[0] == OpenUtterance(3, core.contexts["b"].settings, "b")


def test_each_context_buffers_its_own_text_with_its_own_deadline() -> None:
    core = new_core()
    send(core, Start(max_buffer_delay_ms=1000, context_id="slow"))
    send(core, Text("Slow words", context_id="slow"), at=1.0)
    send(core, Text("Fast words"), at=1.5)
    assert core.deadline == pytest.approx(1.5 + DELAY_S)
    assert core.tick(1.5 + DELAY_S) == [SpeakSegment(1, 0, "Fast words")]
    assert core.deadline == pytest.approx(2.0)
    assert send(core, Flush(context_id="slow"), at=1.9) == [SpeakSegment(0, 0, "Slow words")]
    assert core.deadline == pytest.approx(1.9 + LIMITS.idle_timeout_s)


def test_an_open_utterance_blocks_only_its_own_contexts_start() -> None:
    core = new_core()
    send(core, Text("Open in a", context_id="a"))
    (refused,) = send(core, Start(seed=1, context_id="a"))
    assert refused == SendError(
        ErrorCode.UTTERANCE_IN_PROGRESS, "send end or cancel before changing settings", context_id="a"
    )
    assert isinstance(send(core, Start(seed=1))[0], Announce), "the default context takes its start"
    assert isinstance(send(core, Start(seed=1, context_id="b"))[0], Announce)


def test_contexts_are_bounded_and_close_context_frees_one() -> None:
    gate = Gate()
    core = new_core(gate, max_contexts=2)
    send(core, Text("One.", context_id="a"))
    send(core, Start(context_id="b"))
    (refused,) = send(core, Text("Three.", context_id="c"))
    assert isinstance(refused, SendError) and refused.code is ErrorCode.TOO_MANY_CONTEXTS
    assert refused.context_id == "c" and "c" not in core.contexts
    assert send(core, Text("The default context is not counted."))[0] == OpenUtterance(1, core.settings, None)

    assert send(core, CloseContext("a")) == [StopUtterance(0), SendDone(0, FinishReason.CANCELLED)]
    assert "a" not in core.contexts
    assert send(core, Text("Three.", context_id="c"))[0] == OpenUtterance(2, core.contexts["c"].settings, "c")
    assert send(core, CloseContext("never-opened")) == [], "closing an unknown context is harmless"
    core.done_sent(0)
    assert gate.live == 2


def test_messages_to_a_context_that_does_not_exist_make_none() -> None:
    core = new_core(max_contexts=1)
    assert send(core, Flush(context_id="x")) == []
    assert send(core, Cancel(context_id="x")) == []
    (refused,) = send(core, End(context_id="x"))
    assert isinstance(refused, SendError) and refused.code is ErrorCode.EMPTY_UTTERANCE
    assert list(core.contexts) == [None]


def test_a_failed_segment_names_its_context() -> None:
    core = new_core()
    send(core, Text("Fails here.", context_id="a"))
    failed = core.segment_failed(0, ErrorCode.SYNTHESIS_FAILED, "bad latents", now=1.0)
    assert failed == [SendError(ErrorCode.SYNTHESIS_FAILED, "bad latents", 0, "a"), SendDone(0, FinishReason.ERROR)]
    assert send(core, Text("Fresh.", context_id="a"))[0] == OpenUtterance(1, core.contexts["a"].settings, "a")


def test_queued_utterances_are_bounded_across_contexts() -> None:
    core = new_core()  # max_queued_utterances=2
    send(core, Text("One.", context_id="a"))
    send(core, Text("Two.", context_id="b"))
    (refused,) = send(core, Text("Three."))
    assert isinstance(refused, SendError) and refused.code is ErrorCode.TOO_MANY_UTTERANCES
    assert refused.context_id is None


def test_a_refused_start_or_text_makes_no_context() -> None:
    core = new_core(max_contexts=1)
    (refused,) = send(core, Start(voice="nobody", context_id="a"))
    assert isinstance(refused, SendError) and refused.code is ErrorCode.UNKNOWN_VOICE and refused.context_id == "a"
    (refused,) = send(core, Text("x" * (LIMITS.max_text_chars_per_message + 1), context_id="a"))
    assert isinstance(refused, SendError) and refused.code is ErrorCode.TEXT_TOO_LONG
    assert send(core, Text("", context_id="a")) == []
    assert list(core.contexts) == [None]
    assert isinstance(send(core, Start(context_id="b"))[0], Announce), "the one slot is still free"


def test_a_design_typed_at_a_contexts_start_designs_that_context_only() -> None:
    def designable(start: Start) -> Settings:
        return replace(resolve(start), design_prefix=True)

    core = SessionCore(LIMITS, designable, Gate(), now=0.0)
    core.opened()
    designed = send(core, Text("(a calm, low voice)Hello there. Then", context_id="d"))
    plain = send(core, Text("Hello there. Then"))
    assert designed[1] == SpeakSegment(0, 0, "Hello there.", "a calm, low voice")
    assert plain[1] == SpeakSegment(1, 0, "Hello there.", None)
