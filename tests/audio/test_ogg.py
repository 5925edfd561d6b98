"""Ogg Opus muxing: page structure, CRC, granule positions, opusinfo, decoded duration.

Pages are parsed here by an independent reader (RFC 3533 layout) and checked field by field;
opusinfo, opusdec and ffmpeg then judge the files as external tools.
"""

from __future__ import annotations

import re
import struct
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import soundfile

from voxwire.audio.formats import OggOpusStream, make_encoder
from voxwire.audio.ogg import OggOpusMuxer, build_page, ogg_crc, packet_samples_48k


@dataclass
class Page:
    flags: int
    granule: int
    serial: int
    sequence: int
    crc: int
    lacing: bytes
    body: bytes
    raw: bytes

    @property
    def packets(self) -> list[bytes]:
        packets, current, offset = [], b"", 0
        for value in self.lacing:
            current += self.body[offset : offset + value]
            offset += value
            if value < 255:
                packets.append(current)
                current = b""
        assert current == b"", "test streams never continue a packet onto the next page"
        return packets


def parse_pages(data: bytes) -> list[Page]:
    pages, offset = [], 0
    while offset < len(data):
        capture, version, flags, granule, serial, sequence, crc, count = struct.unpack_from("<4sBBqIIIB", data, offset)
        assert (capture, version) == (b"OggS", 0)
        lacing = data[offset + 27 : offset + 27 + count]
        size = 27 + count + sum(lacing)
        raw = data[offset : offset + size]
        pages.append(Page(flags, granule, serial, sequence, crc, lacing, raw[27 + count :], raw))
        offset += size
    return pages


def crc_by_bits(data: bytes) -> int:
    """Bitwise reference for the table-driven CRC under test."""
    crc = 0
    for byte in data:
        crc ^= byte << 24
        for _ in range(8):
            crc = ((crc << 1) ^ 0x04C11DB7 if crc & 0x80000000 else crc << 1) & 0xFFFFFFFF
    return crc


def encode_ogg(samples: np.ndarray, rate: int, chunk: int) -> tuple[OggOpusStream, list[bytes]]:
    encoder = make_encoder("ogg_opus", rate, serial=0x1234ABCD)
    assert isinstance(encoder, OggOpusStream)
    blocks = []
    for start in range(0, samples.size, chunk):
        blocks += encoder.encode(samples[start : start + chunk])
    return encoder, blocks + encoder.finish()


def test_crc_matches_the_ogg_definition() -> None:
    # CRC-32/POSIX without its final inversion: check value ~0x765E7680
    assert ogg_crc(b"123456789") == 0x89A1897F
    data = bytes(range(256)) * 3
    assert ogg_crc(data) == crc_by_bits(data)


def test_stream_structure(model_rate: int, model_chunk: int, speech: Callable[[int], np.ndarray]) -> None:
    samples = speech(model_rate)
    encoder, blocks = encode_ogg(samples, model_rate, model_chunk)
    pages = parse_pages(b"".join(blocks))
    opus = encoder.opus

    assert [page.sequence for page in pages] == list(range(len(pages)))
    assert {page.serial for page in pages} == {0x1234ABCD}
    for page in pages:
        zeroed = page.raw[:22] + b"\0\0\0\0" + page.raw[26:]
        assert page.crc == crc_by_bits(zeroed)
    assert [page.flags for page in pages] == [0x02] + [0] * (len(pages) - 2) + [0x04]

    head, tags, *audio = pages
    assert head.packets == [struct.pack("<8sBBHIhB", b"OpusHead", 1, 1, opus.pre_skip, model_rate, 0, 0)]
    assert tags.packets[0].startswith(b"OpusTags") and len(tags.packets) == 1
    assert head.granule == tags.granule == 0

    packets_so_far = 0
    for page in audio[:-1]:
        packets_so_far += len(page.packets)
        assert page.granule == packets_so_far * 960
    playable = round(samples.size * 48000 / model_rate)
    assert audio[-1].granule == opus.pre_skip + playable
    total = (packets_so_far + len(audio[-1].packets)) * 960
    assert audio[-2].granule < audio[-1].granule <= total, "end trimming stays within the last page"


def test_a_page_per_chunk_as_soon_as_it_is_encoded(model_rate: int, model_chunk: int) -> None:
    """Streaming: the headers come with the first call and each chunk's packets leave at once."""
    encoder = make_encoder("ogg_opus", model_rate)
    tone = np.sin(np.arange(model_chunk * 4) * 0.05).astype(np.float32) * 0.5
    first = parse_pages(b"".join(encoder.encode(tone[:model_chunk])))
    assert [page.flags for page in first[:2]] == [0x02, 0]
    audio_pages = first[2:]
    if model_rate == 44100:
        # the resampler holds back ~10 ms, so 7056 samples yield 7 of the 8 frames
        assert sum(len(page.packets) for page in audio_pages) == 7
    else:
        assert sum(len(page.packets) for page in audio_pages) == model_chunk * 50 // model_rate
    for start in range(model_chunk, tone.size, model_chunk):
        pages = parse_pages(b"".join(encoder.encode(tone[start : start + model_chunk])))
        assert len(pages) == 1 and len(pages[0].packets) >= 4


def run_opusinfo(path: Path, tool: Callable[[str], str]) -> str:
    result = subprocess.run([tool("opusinfo"), str(path)], capture_output=True, text=True)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    return output


def test_opusinfo_accepts_the_stream_without_warnings(
    model_rate: int, model_chunk: int, speech: Callable[[int], np.ndarray], tool: Callable[[str], str], tmp_path: Path
) -> None:
    samples = speech(model_rate)
    _, blocks = encode_ogg(samples, model_rate, model_chunk)
    path = tmp_path / "speech.opus"
    path.write_bytes(b"".join(blocks))
    output = run_opusinfo(path, tool)
    assert "WARNING" not in output.upper() and "ERROR" not in output.upper(), output
    assert "Pre-skip: 312" in output and f"Original sample rate: {model_rate} Hz" in output, output
    shown = re.search(r"Playback length: (\d+)m:([\d.]+)s", output)
    assert shown is not None, output
    assert abs(int(shown[1]) * 60 + float(shown[2]) - samples.size / model_rate) < 0.001, output


def test_opusinfo_notices_a_corrupted_page(
    speech: Callable[[int], np.ndarray], tool: Callable[[str], str], tmp_path: Path
) -> None:
    """Guards the test above: the checker does report a damaged CRC."""
    _, blocks = encode_ogg(speech(48000)[:48000], 48000, 7680)
    data = bytearray(b"".join(blocks))
    data[-10] ^= 0xFF
    path = tmp_path / "broken.opus"
    path.write_bytes(bytes(data))
    result = subprocess.run([tool("opusinfo"), str(path)], capture_output=True, text=True)
    assert "WARNING" in (result.stdout + result.stderr).upper()


def decoded_lengths(path: Path, tool: Callable[[str], str]) -> dict[str, int]:
    ffmpeg = [tool("ffmpeg"), "-v", "error", "-c:a", "opus", "-i", str(path), "-f", "f32le", "-"]
    ffmpeg_bytes = subprocess.run(ffmpeg, check=True, capture_output=True).stdout
    wav = path.with_suffix(".wav")
    subprocess.run([tool("opusdec"), "--quiet", "--rate", "48000", "--float", str(path), str(wav)], check=True)
    return {"ffmpeg": len(ffmpeg_bytes) // 4, "opusdec": soundfile.info(str(wav)).frames}


@pytest.mark.parametrize("length", [0, 1, 100, 1279, 1281, 44100 * 2 + 17])
def test_decoded_duration_equals_input(
    model_rate: int, model_chunk: int, length: int, tool: Callable[[str], str], tmp_path: Path
) -> None:
    """Pre-skip and end trimming give back exactly the input duration at 48 kHz."""
    samples = (np.random.default_rng(length).standard_normal(length) * 0.1).astype(np.float32)
    _, blocks = encode_ogg(samples, model_rate, model_chunk)
    path = tmp_path / "noise.opus"
    path.write_bytes(b"".join(blocks))
    expected = round(length * 48000 / model_rate)
    for decoder, decoded in decoded_lengths(path, tool).items():
        assert abs(decoded - expected) <= 1, f"{decoder}: {decoded} samples, expected {expected}"


def test_packet_durations_from_the_toc_byte() -> None:
    assert packet_samples_48k(bytes([(16 << 3) | 0])) == 120  # CELT 2.5 ms, one frame
    assert packet_samples_48k(bytes([(19 << 3) | 1, 0])) == 1920  # CELT 20 ms, two frames
    assert packet_samples_48k(bytes([(11 << 3) | 2, 0])) == 5760  # SILK 60 ms, two frames
    assert packet_samples_48k(bytes([(13 << 3) | 3, 3])) == 2880  # hybrid 20 ms, three frames
    with pytest.raises(ValueError):
        packet_samples_48k(b"")


def test_muxer_rejects_impossible_end_trimming() -> None:
    muxer = OggOpusMuxer(pre_skip=312, input_rate=48000, serial=1)
    packet = bytes([(31 << 3)]) + b"\0" * 10  # one 20 ms CELT frame
    muxer.pages([packet, packet])
    with pytest.raises(ValueError, match="end granule"):
        muxer.finish([packet], playable_samples_48k=3 * 960)
    with pytest.raises(ValueError, match="at least one packet"):
        muxer.finish([], playable_samples_48k=0)


def test_pages_split_when_lacing_overflows() -> None:
    muxer = OggOpusMuxer(pre_skip=312, input_rate=48000, serial=1)
    packet = bytes([(31 << 3)]) + b"\0" * 599  # three lacing values each
    pages = parse_pages(b"".join(muxer.pages([packet] * 100)))[2:]
    assert [len(page.packets) for page in pages] == [85, 15]
    assert [page.granule for page in pages] == [85 * 960, 100 * 960]
    with pytest.raises(ValueError, match="lacing values"):
        build_page([b"\0" * 255 * 255], granule=0, serial=1, sequence=0)
