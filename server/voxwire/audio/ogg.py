"""Ogg Opus muxer (RFC 3533 pages, RFC 7845 mapping), written for streaming.

Every call that receives packets returns finished pages at once, so a client gets audio
as soon as it is encoded (one page per model chunk costs ~28 bytes of framing per 160 ms,
where one page per 20 ms packet would add ~11 kb/s). Granule positions count 48 kHz
samples whatever the coding rate; the last page claims only ``pre_skip`` plus the real
length, which is how decoders learn to trim the end padding.
"""

from __future__ import annotations

import secrets
import struct
from collections.abc import Sequence

VENDOR = "voxwire"
FLAG_BOS = 0x02
FLAG_EOS = 0x04
MAX_SEGMENTS = 255
_PAGE_HEADER = struct.Struct("<4sBBqIIIB")
_CRC_OFFSET = 22
_CRC_POLY = 0x04C11DB7


def _crc_table() -> tuple[int, ...]:
    table = []
    for byte in range(256):
        crc = byte << 24
        for _ in range(8):
            crc = (crc << 1) ^ _CRC_POLY if crc & 0x80000000 else crc << 1
        table.append(crc & 0xFFFFFFFF)
    return tuple(table)


_CRC_TABLE = _crc_table()


def ogg_crc(data: bytes | bytearray) -> int:
    """Ogg's CRC-32: polynomial 0x04C11DB7, initial value 0, not reflected, no final xor."""
    crc = 0
    for byte in data:
        crc = ((crc << 8) & 0xFFFFFFFF) ^ _CRC_TABLE[(crc >> 24) ^ byte]
    return crc


def lacing(packet: bytes) -> bytes:
    """Segment table entries for one packet: 255s then a terminating value below 255."""
    full, rest = divmod(len(packet), 255)
    return bytes([255] * full + [rest])


def build_page(packets: Sequence[bytes], *, granule: int, serial: int, sequence: int, flags: int = 0) -> bytes:
    """One Ogg page holding whole ``packets`` (none may continue onto another page)."""
    segments = b"".join(lacing(packet) for packet in packets)
    if len(segments) > MAX_SEGMENTS:
        raise ValueError(f"{len(segments)} lacing values do not fit in one page")
    header = _PAGE_HEADER.pack(b"OggS", 0, flags, granule, serial, sequence, 0, len(segments))
    page = bytearray(header + segments + b"".join(packets))
    struct.pack_into("<I", page, _CRC_OFFSET, ogg_crc(page))
    return bytes(page)


def opus_head(*, pre_skip: int, input_rate: int, channels: int = 1, output_gain: int = 0) -> bytes:
    """RFC 7845 section 5.1 identification header, channel mapping family 0 (mono/stereo)."""
    return struct.pack("<8sBBHIhB", b"OpusHead", 1, channels, pre_skip, input_rate, output_gain, 0)


def opus_tags(vendor: str = VENDOR, comments: Sequence[str] = ()) -> bytes:
    """RFC 7845 section 5.2 comment header; ``comments`` are ``KEY=value`` strings."""
    parts = [b"OpusTags", _length_prefixed(vendor.encode()), struct.pack("<I", len(comments))]
    parts += [_length_prefixed(comment.encode()) for comment in comments]
    return b"".join(parts)


def _length_prefixed(data: bytes) -> bytes:
    return struct.pack("<I", len(data)) + data


_SILK_FRAMES_48K = (480, 960, 1920, 2880)
_HYBRID_FRAMES_48K = (480, 960)
_CELT_FRAMES_48K = (120, 240, 480, 960)


def packet_samples_48k(packet: bytes) -> int:
    """Duration of an Opus packet in 48 kHz samples, from its TOC byte (RFC 6716 section 3.1)."""
    if not packet:
        raise ValueError("empty Opus packet")
    config = packet[0] >> 3
    if config < 12:
        frame = _SILK_FRAMES_48K[config % 4]
    elif config < 16:
        frame = _HYBRID_FRAMES_48K[config % 2]
    else:
        frame = _CELT_FRAMES_48K[config % 4]
    code = packet[0] & 0x03
    if code == 0:
        count = 1
    elif code in (1, 2):
        count = 2
    elif len(packet) < 2:
        raise ValueError("code 3 Opus packet without a frame count byte")
    else:
        count = packet[1] & 0x3F
    return frame * count


class OggOpusMuxer:
    """Turns a sequence of Opus packets into Ogg pages; headers come out with the first pages."""

    def __init__(
        self,
        *,
        pre_skip: int,
        input_rate: int,
        serial: int | None = None,
        vendor: str = VENDOR,
        comments: Sequence[str] = (),
    ) -> None:
        self.pre_skip = pre_skip
        self.serial = secrets.randbits(32) if serial is None else serial
        self._headers = [opus_head(pre_skip=pre_skip, input_rate=input_rate), opus_tags(vendor, comments)]
        self._sequence = 0
        self._granule = 0
        self._finished = False

    @property
    def granule(self) -> int:
        """48 kHz samples in all packets paged so far, pre-skip included."""
        return self._granule

    def pages(self, packets: Sequence[bytes]) -> list[bytes]:
        """Pages for ``packets`` (plus the headers on the first call), flushed immediately."""
        self._check_open()
        return self._header_pages() + self._audio_pages(packets)

    def finish(self, packets: Sequence[bytes], *, playable_samples_48k: int) -> list[bytes]:
        """Last pages; the EOS page's granule is ``pre_skip + playable_samples_48k``, trimming the padding.

        ``packets`` must not be empty: end trimming needs samples on the final page to trim.
        """
        self._check_open()
        if not packets:
            raise ValueError("the final page needs at least one packet")
        end_granule = self.pre_skip + playable_samples_48k
        head = self._header_pages()
        groups = _group_for_pages(packets)
        pages = [page for group in groups[:-1] for page in self._audio_pages(group)]
        previous = self._granule
        self._granule += sum(packet_samples_48k(packet) for packet in groups[-1])
        if not previous <= end_granule <= self._granule:
            raise ValueError(f"end granule {end_granule} outside the last page's range [{previous}, {self._granule}]")
        self._finished = True
        return head + pages + [self._page(groups[-1], end_granule, FLAG_EOS)]

    def _header_pages(self) -> list[bytes]:
        if self._sequence:
            return []
        head, tags = self._headers
        return [self._page([head], 0, FLAG_BOS), self._page([tags], 0, 0)]

    def _audio_pages(self, packets: Sequence[bytes]) -> list[bytes]:
        pages = []
        for group in _group_for_pages(packets):
            self._granule += sum(packet_samples_48k(packet) for packet in group)
            pages.append(self._page(group, self._granule, 0))
        return pages

    def _page(self, packets: Sequence[bytes], granule: int, flags: int) -> bytes:
        page = build_page(packets, granule=granule, serial=self.serial, sequence=self._sequence, flags=flags)
        self._sequence += 1
        return page

    def _check_open(self) -> None:
        if self._finished:
            raise RuntimeError("Ogg stream already finished")


def _group_for_pages(packets: Sequence[bytes]) -> list[list[bytes]]:
    """Split packets into runs whose lacing fits in one page (Opus packets never need to span pages)."""
    groups: list[list[bytes]] = []
    used = MAX_SEGMENTS
    for packet in packets:
        need = len(packet) // 255 + 1
        if used + need > MAX_SEGMENTS:
            groups.append([])
            used = 0
        groups[-1].append(packet)
        used += need
    return groups
