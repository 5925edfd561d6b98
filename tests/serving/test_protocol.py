"""The wire protocol against its golden vectors (shared with the clients), plus round-trip properties."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from voxwire.protocol import wire as protocol
from voxwire.protocol.wire import (
    CLIENT_MESSAGES,
    FRAME_FORMATS,
    MAX_BUFFER_DELAY_MS,
    MAX_SEED,
    SERVER_MESSAGES,
    Audio,
    AudioFrame,
    ErrorCode,
    ProtocolError,
    Start,
    Text,
    decode_client,
    decode_server,
    encode,
)

VECTORS = json.loads((Path(__file__).parents[1] / "fixtures" / "protocol_vectors.json").read_text("utf-8"))


def cases(section: str) -> list:
    return [pytest.param(case, id=case["name"]) for case in VECTORS[section]]


def test_vectors_are_for_this_version():
    assert (VECTORS["protocol"], VECTORS["frame_version"]) == (protocol.PROTOCOL_VERSION, protocol.FRAME_VERSION)


@pytest.mark.parametrize("case", cases("client_messages"))
def test_client_message_vectors(case):
    message = decode_client(case.get("input", case["text"]))
    assert type(message) is CLIENT_MESSAGES[json.loads(case["text"])["type"]]
    assert encode(message) == case["text"]


@pytest.mark.parametrize("case", cases("server_messages"))
def test_server_message_vectors(case):
    message = decode_server(case["text"])
    assert encode(message) == case["text"]
    if isinstance(message, Audio):  # the JSON form of a frame: its base64 is the binary frame's payload
        frame = message.frame()
        assert Audio.of(frame) == message
        assert frame.encode()[len(frame.encode()) - len(frame.payload()) :] == base64.b64decode(message.audio)


@pytest.mark.parametrize("case", cases("client_errors"))
def test_refused_client_message_vectors(case):
    with pytest.raises(ProtocolError) as caught:
        decode_client(case["text"])
    assert caught.value.code == ErrorCode(case["code"])


@pytest.mark.parametrize("case", cases("audio_frames"))
def test_audio_frame_vectors(case):
    spec = case["frame"]
    packets = tuple(map(bytes.fromhex, spec["packets"]))
    frame = AudioFrame(spec["format"], spec["utterance"], spec["sequence"], packets, spec.get("context_id"))
    assert AudioFrame.decode(bytes.fromhex(case["hex"])) == frame
    if not case.get("decode_only"):
        assert frame.encode().hex() == case["hex"]


@pytest.mark.parametrize("case", cases("bad_frames"))
def test_bad_frame_vectors(case):
    with pytest.raises(ProtocolError) as caught:
        AudioFrame.decode(bytes.fromhex(case["hex"]))
    assert caught.value.code is ErrorCode.BAD_FRAME


def test_vectors_cover_every_message_and_format():
    client = {json.loads(case["text"])["type"] for case in VECTORS["client_messages"]}
    server = {json.loads(case["text"])["type"] for case in VECTORS["server_messages"]}
    formats = {case["frame"]["format"] for case in VECTORS["audio_frames"]}
    assert (client, server, formats) == (set(CLIENT_MESSAGES), set(SERVER_MESSAGES), set(FRAME_FORMATS))


@pytest.mark.parametrize("context_id", [None, "a", "ab", "abc", "abcd", "é" * 32])
def test_the_pcm_f32_payload_is_four_byte_aligned(context_id):
    data = AudioFrame("pcm_f32le", 0, 0, (bytes(8),), context_id).encode()
    assert (len(data) - 8) % 4 == 0


def test_a_frame_of_the_default_context_keeps_the_twelve_byte_header():
    frame = AudioFrame("pcm_s16le", 3, 4, (bytes(4),))
    assert frame.encode()[2:4] == (12).to_bytes(2, "little") and len(frame.encode()) == 16


def test_an_old_decoder_that_skips_the_header_reads_a_context_frame_s_payload():
    """A version-1 client that knows no context (it skips ``header_size`` bytes, as the spec says) gets the audio."""
    data = AudioFrame("pcm_s16le", 0, 0, (b"\x01\x00\x02\x00",), "agent-b").encode()
    assert data[int.from_bytes(data[2:4], "little") :] == b"\x01\x00\x02\x00"


def test_an_opus_packet_too_long_for_its_length_prefix_is_refused():
    with pytest.raises(ValueError, match=r"1\.\.65535"):
        AudioFrame("opus", 0, 0, (bytes(70_000),)).encode()


def test_the_protocol_module_needs_only_the_standard_library():
    code = (
        "import sys, voxwire.protocol.wire; "
        "heavy = {'torch', 'numpy', 'aiohttp'} & set(sys.modules); assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


starts = st.builds(
    Start,
    voice=st.none() | st.text(max_size=20),
    format=st.none() | st.sampled_from(FRAME_FORMATS),
    seed=st.none() | st.integers(0, MAX_SEED - 1),
    cfg_value=st.none() | st.floats(-1e6, 1e6, allow_nan=False),
    inference_timesteps=st.none() | st.integers(1, 1000),
    max_buffer_delay_ms=st.none() | st.integers(0, MAX_BUFFER_DELAY_MS),
    persona=st.none() | st.text(max_size=20),
    context_id=st.none() | st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=16),
)
texts = st.builds(
    Text,
    st.text(st.characters(exclude_categories=["Cs"])),
    st.none() | st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=16),
)


@pytest.mark.slow
@given(st.one_of(starts, texts))
def test_client_messages_survive_a_round_trip(message):
    assert decode_client(encode(message)) == message


@given(
    st.sampled_from(FRAME_FORMATS),
    st.integers(0, 2**32 - 1),
    st.integers(0, 2**32 - 1),
    st.lists(st.binary(min_size=1, max_size=300), min_size=1, max_size=8),
    st.none() | st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=16),
)
def test_audio_frames_survive_a_round_trip(fmt, utterance, sequence, packets, context_id):
    frame = AudioFrame(fmt, utterance, sequence, tuple(packets), context_id)
    decoded = AudioFrame.decode(frame.encode())
    expected = AudioFrame(
        fmt, utterance, sequence, tuple(packets) if fmt == "opus" else (b"".join(packets),), context_id
    )
    assert decoded == expected
    assert decode_server(encode(Audio.of(frame))).frame() == expected


@pytest.mark.parametrize(
    ("fmt", "audio"), [("pcm_mulaw", "not base64!"), ("pcm_mulaw", "AQ"), ("mp3", "AQA="), ("opus", "BQCqqw==")]
)
def test_an_audio_message_that_is_no_frame_is_a_bad_frame(fmt, audio):
    message = decode_server(encode(Audio(fmt, 0, 0, audio)))
    with pytest.raises(ProtocolError) as caught:
        message.frame()
    assert caught.value.code is ErrorCode.BAD_FRAME


@pytest.mark.parametrize(
    ("fields", "code"),
    [
        ({"ends_s": [0.3]}, ErrorCode.INVALID_FIELD),
        ({"words": "Hi there."}, ErrorCode.INVALID_FIELD),
        ({"starts_s": [0.1, "0.3"]}, ErrorCode.INVALID_FIELD),
        ({"starts_s": [0.4, 0.3]}, ErrorCode.OUT_OF_RANGE),
        ({"starts_s": [-0.1, 0.3]}, ErrorCode.OUT_OF_RANGE),
    ],
)
def test_a_words_message_needs_one_start_and_one_end_per_word(fields, code):
    ok = {"words": ["Hi", "there."], "starts_s": [0.1, 0.3], "ends_s": [0.3, 0.7]}
    assert decode_server(json.dumps({"type": "words", "utterance": 0, "index": 0, **ok})).words == ("Hi", "there.")
    with pytest.raises(ProtocolError) as caught:
        decode_server(json.dumps({"type": "words", "utterance": 0, "index": 0, **ok, **fields}))
    assert caught.value.code is code
