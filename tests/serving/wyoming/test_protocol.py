"""The Wyoming core, sans I/O: events read whatever their split, the answers each event gets, and its limits."""

from __future__ import annotations

import io
import json

import pytest
from wyoming.event import Event, read_event, write_event

from voxwire.protocol.error_codes import ErrorCode
from voxwire.serving.wyoming.protocol import (
    BadEvent,
    Close,
    EndStream,
    EventDecoder,
    Send,
    SendInfo,
    Speak,
    SpeechPart,
    WyomingCore,
    WyomingEvent,
    WyomingLimits,
    encode_event,
)

LIMITS = WyomingLimits(
    max_messages_per_s=100.0, max_text_chars_per_utterance=200, max_queued_utterances=2, idle_timeout_s=10.0
)


def core(limits: WyomingLimits = LIMITS) -> WyomingCore:
    return WyomingCore(limits, lambda name: name in {"default", "alloy"}, now=0.0)


def event(kind: str, **data: object) -> bytes:
    """An event as the wyoming package writes it: data after the header line (``data_length``)."""
    body = json.dumps(data).encode()
    header = {"type": kind, "version": "1.10.2", **({"data_length": len(body)} if data else {})}
    return json.dumps(header).encode() + b"\n" + (body if data else b"")


def errors(actions: list) -> list[str]:
    return [
        action.event.data["code"] for action in actions if isinstance(action, Send) and action.event.type == "error"
    ]


def test_events_are_read_whatever_their_split() -> None:
    stream = event("describe") + event("synthesize", text="Hi.") + b'{"type": "ping", "payload_length": 2}\nab'
    whole = EventDecoder(1000).feed(stream)
    for cut in range(1, len(stream)):
        decoder = EventDecoder(1000)
        assert decoder.feed(stream[:cut]) + decoder.feed(stream[cut:]) == whole
    assert whole == [
        WyomingEvent("describe"),
        WyomingEvent("synthesize", {"text": "Hi."}),
        WyomingEvent("ping", {}, b"ab"),
    ]


def test_an_encoded_event_reads_back_with_the_wyoming_package() -> None:
    sent = WyomingEvent("audio-chunk", {"rate": 16000, "width": 2, "channels": 1}, b"\0\1")
    assert read_event(io.BytesIO(encode_event(sent))) == Event("audio-chunk", sent.data, b"\0\1")


def test_an_event_the_wyoming_package_writes_is_read() -> None:
    written = io.BytesIO()
    write_event(Event("synthesize", {"text": "Héllo.", "voice": {"name": "alloy"}}), written)
    assert EventDecoder(1000).feed(written.getvalue()) == [
        WyomingEvent("synthesize", {"text": "Héllo.", "voice": {"name": "alloy"}})
    ]


def test_a_garbage_line_is_an_error_and_the_next_event_is_read() -> None:
    connection = core()
    actions = connection.receive(b"this is not json\n" + event("describe"), now=1.0)
    assert errors(actions) == [ErrorCode.INVALID_JSON.value]
    assert isinstance(actions[-1], SendInfo)
    assert not connection.closed


def test_a_length_that_is_not_a_count_closes_after_its_error() -> None:
    connection = core()
    actions = connection.receive(b'{"type": "synthesize", "data_length": -5}\n' + event("describe"), now=1.0)
    assert errors(actions) == [ErrorCode.INVALID_FIELD.value]
    assert isinstance(actions[-1], Close) and connection.closed


def test_an_event_over_the_size_limit_closes_after_its_error() -> None:
    header = json.dumps({"type": "synthesize", "data_length": LIMITS.max_event_bytes}).encode() + b"\n"
    actions = core().receive(header, now=1.0)
    assert errors(actions) == [ErrorCode.MESSAGE_TOO_LARGE.value]
    assert isinstance(actions[-1], Close)
    assert EventDecoder(100).feed(b"x" * 101) == [
        BadEvent(ErrorCode.MESSAGE_TOO_LARGE, "an event header line is over 100 bytes", fatal=True)
    ]


def test_synthesize_is_one_whole_utterance_in_the_named_voice() -> None:
    actions = core().receive(event("synthesize", text=" Hello there. How are you? ", voice={"name": "alloy"}), 1.0)
    assert actions == [Speak("Hello there. How are you?", "alloy", SpeechPart.WHOLE)]


def test_a_voice_of_only_a_language_is_the_default_voice() -> None:
    actions = core().receive(event("synthesize", text="Hi.", voice={"language": "en"}), 1.0)
    assert actions == [Speak("Hi.", None, SpeechPart.WHOLE)]


@pytest.mark.parametrize(
    ("data", "code"),
    [
        ({"text": "Hi.", "voice": {"name": "nobody"}}, ErrorCode.UNKNOWN_VOICE),
        ({"text": 5}, ErrorCode.INVALID_FIELD),
        ({"text": "Hi.", "voice": "alloy"}, ErrorCode.INVALID_FIELD),
        ({"text": "x" * 201}, ErrorCode.TEXT_TOO_LONG),
        ({"text": " ... "}, ErrorCode.EMPTY_UTTERANCE),
    ],
)
def test_a_bad_synthesize_is_refused_and_the_connection_kept(data: dict, code: ErrorCode) -> None:
    connection = core()
    assert errors(connection.receive(event("synthesize", **data), 1.0)) == [code.value]
    assert not connection.closed
    assert connection.receive(event("synthesize", text="Hi."), 2.0) == [Speak("Hi.", None, SpeechPart.WHOLE)]


def test_a_stream_speaks_each_sentence_once_complete_then_stops() -> None:
    connection = core()
    assert connection.receive(event("synthesize-start", voice={"name": "alloy"}), 1.0) == []
    first = connection.receive(event("synthesize-chunk", text="Hello there. How"), 2.0)
    assert first == [Speak("Hello there.", "alloy", SpeechPart.FIRST_SENTENCE)]
    # Home Assistant also sends the whole text as a synthesize, for servers that do not stream: dropped.
    assert connection.receive(event("synthesize", text="Hello there. How are you?"), 3.0) == []
    assert connection.receive(event("synthesize-chunk", text=" are you"), 4.0) == []
    rest = connection.receive(event("synthesize-stop"), 5.0)
    assert rest == [Speak("How are you", "alloy", SpeechPart.NEXT_SENTENCE), EndStream()]


def test_a_stream_over_the_text_limit_drops_the_rest_and_still_stops() -> None:
    connection = core()
    connection.receive(event("synthesize-start"), 1.0)
    assert errors(connection.receive(event("synthesize-chunk", text="y" * 201), 2.0)) == ["utterance_too_long"]
    assert connection.receive(event("synthesize-chunk", text="More. "), 3.0) == []
    assert connection.receive(event("synthesize-stop"), 4.0) == [EndStream()]


def test_a_stream_in_an_unknown_voice_is_refused_and_still_stops() -> None:
    connection = core()
    assert errors(connection.receive(event("synthesize-start", voice={"name": "nobody"}), 1.0)) == ["unknown_voice"]
    assert connection.receive(event("synthesize-chunk", text="Hello there. Bye."), 2.0) == []
    assert connection.receive(event("synthesize-stop"), 3.0) == [EndStream()]


def test_stream_events_out_of_place_are_refused() -> None:
    connection = core()
    assert errors(connection.receive(event("synthesize-chunk", text="Hi."), 1.0)) == ["invalid_message"]
    assert errors(connection.receive(event("synthesize-stop"), 1.0)) == ["invalid_message"]
    connection.receive(event("synthesize-start"), 1.0)
    assert errors(connection.receive(event("synthesize-start"), 1.0)) == ["utterance_in_progress"]


def test_requests_not_done_are_bounded() -> None:
    connection = core()
    for _ in range(LIMITS.max_queued_utterances):
        assert isinstance(connection.receive(event("synthesize", text="Hi."), 1.0)[0], Speak)
    assert errors(connection.receive(event("synthesize", text="Hi."), 1.0)) == ["too_many_utterances"]
    connection.released(2.0)
    assert isinstance(connection.receive(event("synthesize", text="Hi."), 2.0)[0], Speak)


def test_ping_is_answered_and_other_types_are_dropped() -> None:
    actions = core().receive(event("ping", text="x") + event("select-program", name="voxwire"), 1.0)
    assert actions == [Send(WyomingEvent("pong", {"text": "x"}))]


def test_a_flood_is_closed() -> None:
    connection = core(WyomingLimits(2.0, 200, 2, 10.0))
    actions = connection.receive(event("ping") * 3, 1.0)
    assert errors(actions) == ["rate_limited"] and isinstance(actions[-1], Close)


def test_an_idle_connection_is_closed_but_never_one_with_a_request_unfinished() -> None:
    connection = core()
    assert connection.deadline() == 10.0
    assert connection.tick(9.9) == []
    connection.receive(event("synthesize", text="Hi."), 5.0)
    assert connection.deadline() is None
    connection.released(20.0)
    assert connection.deadline() == 30.0
    actions = connection.tick(30.0)
    assert errors(actions) == ["idle_timeout"] and isinstance(actions[-1], Close)
