"""What one utterance's audio arrivals say: latencies, real-time factors, gaps and a simulated player's underruns.

Every time is in seconds from the utterance's first ``text`` sent (the server's ``ttfa_s`` origin), or over HTTP
from the request sent. Audio durations come from the frames themselves: PCM byte counts, Opus packets' TOC bytes,
Ogg granule positions; over HTTP the body's PCM byte count (after a WAV header).
"""

from __future__ import annotations

import enum
import itertools
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from voxwire.audio.ogg import _PAGE_HEADER, packet_samples_48k
from voxwire.protocol.wire import AudioFrame

OPUS_RATE = 48000
_PCM_BYTES = {"pcm_s16le": 2, "pcm_f32le": 4}
BENCH_FORMATS = ("opus", "ogg_opus", "pcm_s16le", "pcm_f32le")
HTTP_FORMATS = ("pcm", "wav")
"""``--response-format`` over HTTP: the formats whose duration the byte count gives (both s16le mono)."""
OPENAI_PCM_RATE = 24000
"""OpenAI's ``pcm`` is 24 kHz s16le mono (the server's ``audio.formats.OPENAI_RESPONSE_FORMATS``, which the client
side cannot import: it loads PyAV)."""
_WAV_HEADER = struct.Struct("<4sI4s4sIHHIIHH4sI")
"""The canonical 44-byte RIFF/WAVE header of mono s16le PCM, as the server streams it (sizes unknown)."""


class RequestKind(str, enum.Enum):
    """How an utterance was asked for, which says what its record measures."""

    WEBSOCKET = "websocket"
    """A live session: text in, audio frames out, played as they come (gaps and a simulated player's underruns)."""
    HTTP_STREAM = "http_stream"
    """``POST /v1/audio/speech``, the body played as it arrives (gaps and underruns, as a live session's)."""
    HTTP_FILE = "http_file"
    """``POST /v1/audio/speech``, the body wanted whole (a file): time to the last byte, no player."""


class AudioMeter:
    """Per frame of one utterance: the seconds of audio it carries and whether a decoder can produce sound yet."""

    def __init__(self, fmt: str, sample_rate: int) -> None:
        self.format = fmt
        self.sample_rate = sample_rate
        self._granule = 0

    def feed(self, frame: AudioFrame) -> tuple[float, bool]:
        if self.format == "opus":
            samples = sum(packet_samples_48k(packet) for packet in frame.packets)
            return samples / OPUS_RATE, bool(frame.packets)
        payload = b"".join(frame.packets)
        if self.format == "ogg_opus":
            # The header pages have granule 0: audio is decodable once a page with samples arrived.
            last = max((granule for granule in _ogg_granules(payload)), default=self._granule)
            seconds, self._granule = max(last - self._granule, 0) / OPUS_RATE, max(last, self._granule)
            return seconds, self._granule > 0
        width = _PCM_BYTES[self.format]
        return len(payload) // width / self.sample_rate, len(payload) >= width


class BodyMeter:
    """Per chunk of an HTTP response body (``pcm`` or ``wav``): the seconds of audio it completes; a chunk may end
    mid-sample or mid-header."""

    def __init__(self, response_format: str) -> None:
        if response_format not in HTTP_FORMATS:
            raise ValueError(f"response_format={response_format!r} is invalid: must be one of {HTTP_FORMATS}")
        self._header = b"" if response_format == "wav" else None
        self._rate = OPENAI_PCM_RATE
        self._data_bytes = 0

    def feed(self, chunk: bytes) -> float:
        """Seconds of audio ``chunk`` completes; raises ``ValueError`` on a WAV header that is not s16le mono."""
        if self._header is not None and len(self._header) < _WAV_HEADER.size:
            missing = _WAV_HEADER.size - len(self._header)
            self._header, chunk = self._header + chunk[:missing], chunk[missing:]
            if len(self._header) < _WAV_HEADER.size:
                return 0.0
            riff, _, wave, _, _, pcm, channels, rate, _, _, bits, _, _ = _WAV_HEADER.unpack(self._header)
            if (riff, wave, pcm, channels, bits) != (b"RIFF", b"WAVE", 1, 1, 16):
                raise ValueError("the body's WAV header is not mono s16le PCM")
            self._rate = rate
        before = self._data_bytes // 2
        self._data_bytes += len(chunk)
        return (self._data_bytes // 2 - before) / self._rate


def _ogg_granules(data: bytes) -> list[int]:
    """Granule positions of the whole Ogg pages in ``data`` (the server never splits a page across frames)."""
    granules, offset = [], 0
    while offset + _PAGE_HEADER.size <= len(data):
        _, _, _, granule, _, _, _, segments = _PAGE_HEADER.unpack_from(data, offset)
        table = data[offset + _PAGE_HEADER.size : offset + _PAGE_HEADER.size + segments]
        offset += _PAGE_HEADER.size + segments + sum(table)
        granules.append(granule)
    return granules


@dataclass(frozen=True)
class PlayerResult:
    underruns: int
    """Times the buffer ran dry while more audio was still to come."""
    stall_s: float
    """Total silence those underruns caused (until the buffer was refilled to the lead)."""


def simulate_player(arrivals: Sequence[tuple[float, float]], lead_s: float) -> PlayerResult:
    """A player fed ``(arrival time, seconds of audio)`` chunks in order, that (re)starts once ``lead_s`` is
    buffered (or the stream ended) and then consumes audio in real time."""
    underruns, stall_s = 0, 0.0
    buffered, clock, playing = 0.0, 0.0, False
    dry_since: float | None = None  # when the current stall began; None while playing or before the start
    for at, seconds in arrivals:
        if playing:
            buffered -= at - clock
            if buffered < 0:  # it ran dry (at clock + what was buffered) before this chunk came
                underruns += 1
                playing, dry_since, buffered = False, at + buffered, 0.0
        clock = at
        buffered += seconds
        if not playing and buffered >= lead_s:
            stall_s += 0.0 if dry_since is None else at - dry_since
            playing, dry_since = True, None
    if dry_since is not None:  # refilled only by the end of the stream
        stall_s += clock - dry_since
    return PlayerResult(underruns, stall_s)


@dataclass
class UtteranceRecord:
    """One measured utterance; latencies in milliseconds, ``None`` when never reached (see ``error``)."""

    level: float
    """The concurrency (closed loop) or arrival rate (open loop) it ran under."""
    text_chars: int
    started_s: float
    """When its first text went out, from the start of its level's run."""
    connect_ms: float | None = None
    """WebSocket handshake up to the first ``ready`` (open loop: a connection per utterance; closed loop: per user,
    recorded on the user's first utterance)."""
    ttfa_ms: float | None = None
    """First text sent to first audio frame received."""
    ttfd_ms: float | None = None
    """First text sent to the first frame a decoder can produce sound from (Ogg: past the header pages)."""
    wall_s: float | None = None
    """First text sent to ``done`` received."""
    audio_s: float = 0.0
    rtf: float | None = None
    """(wall - TTFA) / audio seconds, as Nano-vLLM defines it: below 1 keeps up with playback once started."""
    rtf_wall: float | None = None
    """wall / audio seconds."""
    chunk_gaps_ms: list[float] = field(default_factory=list)
    """Between consecutive audio frames."""
    underruns: int = 0
    stall_ms: float = 0.0
    finish_reason: str | None = None
    error: str | None = None
    """The server's error code (or the client's, e.g. ``connection_lost``); such utterances have no latencies."""
    user: int | None = None
    """The closed-loop user (or open-loop visitor) that spoke it."""
    server_ttfa_ms: float | None = None
    """The server's own TTFA (its ``done.ttfa_s``: first text received to first frame sent): what is left of
    ``ttfa_ms`` is the network and this client's own delay."""
    engine_ttfc_ms: float | None = None
    """Of ``server_ttfa_ms``, the engine's time to first chunk (``done.engine_ttfc_s``): the rest is waiting for
    a complete sentence and encoding and sending the first chunk."""
    kind: RequestKind = RequestKind.WEBSOCKET
    ttfb_ms: float | None = None
    """HTTP: request sent to the response's first byte (its status line; voxwire answers once the first audio is
    ready). Its ``wall_s`` ends with the body's last byte, and its ``ttfa_ms`` is the body's first chunk."""

    def complete(
        self, arrivals: Sequence[tuple[float, float]], decodable_at: float | None, lead_s: float | None
    ) -> None:
        """Fill the derived fields from the frames' ``(arrival, seconds)`` once ``done`` came at ``wall_s``;
        ``lead_s`` None: the audio is not played as it arrives (a file), so no gaps and no player."""
        if not arrivals or self.wall_s is None:
            return
        first = arrivals[0][0]
        self.ttfa_ms = first * 1000
        self.ttfd_ms = None if decodable_at is None else decodable_at * 1000
        self.audio_s = sum(seconds for _, seconds in arrivals)
        if self.audio_s > 0:
            self.rtf = (self.wall_s - first) / self.audio_s
            self.rtf_wall = self.wall_s / self.audio_s
        if lead_s is None:
            return
        times = [at for at, _ in arrivals]
        self.chunk_gaps_ms = [(b - a) * 1000 for a, b in itertools.pairwise(times)]
        player = simulate_player(arrivals, lead_s)
        self.underruns, self.stall_ms = player.underruns, player.stall_s * 1000


def percentiles(values: Sequence[float]) -> dict[str, float | None]:
    """p50, p90, p99, mean and max (all None without values); linear interpolation between samples."""
    finite = [value for value in values if value is not None and math.isfinite(value)]
    if not finite:
        return {"p50": None, "p90": None, "p99": None, "mean": None, "max": None}
    p50, p90, p99 = np.percentile(finite, [50, 90, 99])
    return {
        "p50": float(p50),
        "p90": float(p90),
        "p99": float(p99),
        "mean": float(np.mean(finite)),
        "max": float(max(finite)),
    }
