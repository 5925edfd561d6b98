"""The wire protocol against its golden vectors (shared with the clients), plus round-trip properties."""

from __future__ import annotations

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


@pytest.mark.parametrize("case", cases("client_errors"))
def test_refused_client_message_vectors(case):
    with pytest.raises(ProtocolError) as caught:
        decode_client(case["text"])
    assert caught.value.code == ErrorCode(case["code"])


@pytest.mark.parametrize("case", cases("audio_frames"))
def test_audio_frame_vectors(case):
    spec = case["frame"]
    frame = AudioFrame(spec["format"], spec["utterance"], spec["sequence"], tuple(map(bytes.fromhex, spec["packets"])))
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


def test_the_pcm_f32_payload_is_four_byte_aligned():
    data = AudioFrame("pcm_f32le", 0, 0, (bytes(8),)).encode()
    assert (len(data) - 8) % 4 == 0


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
)
texts = st.builds(Text, st.text(st.characters(exclude_categories=["Cs"])))


@given(st.one_of(starts, texts))
def test_client_messages_survive_a_round_trip(message):
    assert decode_client(encode(message)) == message


@given(
    st.sampled_from(FRAME_FORMATS),
    st.integers(0, 2**32 - 1),
    st.integers(0, 2**32 - 1),
    st.lists(st.binary(min_size=1, max_size=300), min_size=1, max_size=8),
)
def test_audio_frames_survive_a_round_trip(fmt, utterance, sequence, packets):
    frame = AudioFrame(fmt, utterance, sequence, tuple(packets))
    decoded = AudioFrame.decode(frame.encode())
    expected = tuple(packets) if fmt == "opus" else (b"".join(packets),)
    assert decoded == AudioFrame(fmt, utterance, sequence, expected)
