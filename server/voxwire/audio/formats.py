"""Output formats and the one factory that both the WebSocket and the HTTP paths use.

Every encoder takes float32 mono chunks at the model rate through ``encode`` and returns
byte blocks that are ready to send (possibly none yet); ``finish`` returns the rest. Blocks
are never empty. Per format:

- ``opus``: raw Opus packets, one 20 ms frame per block (for WebCodecs ``AudioDecoder``
  without a description, or any framing the transport adds). ``encoder.opus.pre_skip``
  tells the client how many 48 kHz samples to drop.
- ``ogg_opus``: RFC 7845 Ogg pages, one page per chunk; the first block carries the headers.
- ``pcm_s16le`` / ``pcm_f32le``: raw little-endian mono samples.
- ``pcm_mulaw`` / ``pcm_alaw``: G.711 bytes (``audio/g711.py``), 8 kHz unless ``output_rate`` says otherwise,
  as phone gateways take them.
- ``wav``: s16le with a streaming header (0xFFFFFFFF sizes) first; ``final_header()`` gives
  the header with real sizes for a consumer that can seek back and patch its file.
- ``flac``: ``fLaC`` and a STREAMINFO with the length unknown first, then each FLAC frame as
  soon as it is encoded (``audio/flac.py``); ``final_header()`` gives the STREAMINFO with the
  real count and MD5.

``whole_file`` makes a finished stream a file with its real sizes (a WAV's and a FLAC's header
rewritten; the other formats carry no length to fix).
- ``mp3``: constant bit rate MPEG audio frames (``audio/mp3.py``); ``aac``: AAC-LC in ADTS
  frames (``audio/aac.py``). Both, like flac, go through PyAV's FFmpeg and hold back at most one
  codec frame.

``output_rate`` resamples PCM-family and PyAV-encoded output (OpenAI's ``pcm`` is 24 kHz s16le)
and, for the Opus formats, picks the coding rate (one of 8/12/16/24/48 kHz); ``output_rates``
says which rates each format takes. ``speed`` changes the tempo before any of it
(``audio/tempo.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from enum import Enum
from typing import Protocol

import numpy as np

from voxwire.audio.aac import ADTS_RATE_INDEX, AacStream
from voxwire.audio.flac import FlacStream
from voxwire.audio.g711 import to_alaw, to_mulaw
from voxwire.audio.mp3 import MP3_RATES, Mp3Stream
from voxwire.audio.ogg import OggOpusMuxer
from voxwire.audio.opus import DEFAULT_BITRATE, DEFAULT_COMPLEXITY, OPUS_RATES, OpusEncoder
from voxwire.audio.pcm import to_f32le, to_s16le, wav_header
from voxwire.audio.resample import StreamResampler
from voxwire.audio.tempo import StreamTempo


class AudioFormat(str, Enum):
    OPUS = "opus"
    OGG_OPUS = "ogg_opus"
    PCM_S16LE = "pcm_s16le"
    PCM_F32LE = "pcm_f32le"
    PCM_MULAW = "pcm_mulaw"
    PCM_ALAW = "pcm_alaw"
    WAV = "wav"
    FLAC = "flac"
    MP3 = "mp3"
    AAC = "aac"


OPENAI_RESPONSE_FORMATS: dict[str, tuple[AudioFormat, int | None]] = {
    "opus": (AudioFormat.OGG_OPUS, None),
    "wav": (AudioFormat.WAV, None),
    "flac": (AudioFormat.FLAC, None),
    "mp3": (AudioFormat.MP3, None),
    "aac": (AudioFormat.AAC, None),
    "pcm": (AudioFormat.PCM_S16LE, 24000),
    "mulaw": (AudioFormat.PCM_MULAW, None),
    "alaw": (AudioFormat.PCM_ALAW, None),
}
"""OpenAI ``response_format`` (and other OpenAI-compatible servers' ``mulaw``, ``alaw``) -> (format, default output
rate); ``None`` keeps the model's rate (the G.711 formats: ``TELEPHONY_RATE``)."""

TELEPHONY_RATE = 8000
"""The rate of the G.711 formats when no ``output_rate`` is asked for: the telephone network's."""

RESAMPLED_RATES = range(8000, 192_000 + 1)
"""The rates of the formats that take any rate (PCM, WAV, FLAC: soxr resamples to any): from the telephone
network's to studio masters'."""


def output_rates(fmt: AudioFormat) -> Collection[int]:
    """The ``output_rate`` values ``fmt``'s encoder takes (G.711: only the telephone network's rate)."""
    if fmt in (AudioFormat.OPUS, AudioFormat.OGG_OPUS):
        return OPUS_RATES
    if fmt in (AudioFormat.PCM_MULAW, AudioFormat.PCM_ALAW):
        return (TELEPHONY_RATE,)
    if fmt is AudioFormat.MP3:
        return MP3_RATES
    if fmt is AudioFormat.AAC:
        return ADTS_RATE_INDEX.keys()
    return RESAMPLED_RATES


class StreamEncoder(Protocol):
    sample_rate: int
    """Rate of the audio in the output (for Opus, the coding rate; decoders may output 48 kHz)."""
    content_type: str

    def encode(self, chunk: np.ndarray) -> list[bytes]: ...

    def finish(self) -> list[bytes]: ...


class OpusPacketStream:
    """Raw Opus packets, one per 20 ms frame; ``opus`` exposes pre-skip, rate and settings."""

    content_type = "audio/opus"

    def __init__(self, opus: OpusEncoder) -> None:
        self.opus = opus
        self.sample_rate = opus.sample_rate

    def encode(self, chunk: np.ndarray) -> list[bytes]:
        return self.opus.encode(chunk)

    def finish(self) -> list[bytes]:
        return self.opus.finish()


class OggOpusStream:
    """Ogg Opus pages, one page per chunk, headers first, end-trimmed EOS page last."""

    content_type = "audio/ogg; codecs=opus"

    def __init__(self, opus: OpusEncoder, *, serial: int | None = None) -> None:
        self.opus = opus
        self.sample_rate = opus.sample_rate
        self.muxer = OggOpusMuxer(pre_skip=opus.pre_skip, input_rate=opus.input_rate, serial=serial)

    def encode(self, chunk: np.ndarray) -> list[bytes]:
        return self.muxer.pages(self.opus.encode(chunk))

    def finish(self) -> list[bytes]:
        return self.muxer.finish(self.opus.finish(), playable_samples_48k=self.opus.real_samples_48k)


class PcmStream:
    """Raw little-endian samples at ``output_rate``."""

    def __init__(
        self, input_rate: int, output_rate: int, convert: Callable[[np.ndarray], bytes], encoding: str
    ) -> None:
        self.sample_rate = output_rate
        self.content_type = f"audio/pcm;rate={output_rate};encoding={encoding}"
        self._resampler = StreamResampler(input_rate, output_rate)
        self._convert = convert

    def encode(self, chunk: np.ndarray) -> list[bytes]:
        return self._blocks(self._resampler.process(chunk))

    def finish(self) -> list[bytes]:
        return self._blocks(self._resampler.flush())

    def _blocks(self, samples: np.ndarray) -> list[bytes]:
        return [self._convert(samples)] if samples.size else []


class WavStream:
    """s16le WAV: a streaming header (unknown sizes), then the samples."""

    content_type = "audio/wav"

    def __init__(self, input_rate: int, output_rate: int) -> None:
        self.sample_rate = output_rate
        self._pcm = PcmStream(input_rate, output_rate, to_s16le, "s16le")
        self._data_bytes = 0
        self._header_sent = False

    def encode(self, chunk: np.ndarray) -> list[bytes]:
        return self._with_header(self._pcm.encode(chunk))

    def finish(self) -> list[bytes]:
        return self._with_header(self._pcm.finish())

    def final_header(self) -> bytes:
        """The header with the real sizes, to overwrite the first 44 bytes of a seekable file."""
        return wav_header(self.sample_rate, self._data_bytes // 2)

    def _with_header(self, blocks: list[bytes]) -> list[bytes]:
        self._data_bytes += sum(len(block) for block in blocks)
        if self._header_sent:
            return blocks
        self._header_sent = True
        return [wav_header(self.sample_rate), *blocks]


class TempoEncoder:
    """``encoder`` fed through a ``StreamTempo``: the same format, rate and content type, spoken faster or slower."""

    def __init__(self, encoder: StreamEncoder, tempo: StreamTempo) -> None:
        self.encoder = encoder
        self.tempo = tempo
        self.sample_rate = encoder.sample_rate
        self.content_type = encoder.content_type

    def encode(self, chunk: np.ndarray) -> list[bytes]:
        return self.encoder.encode(self.tempo.process(chunk))

    def finish(self) -> list[bytes]:
        return [*self.encoder.encode(self.tempo.flush()), *self.encoder.finish()]


def whole_file(encoder: StreamEncoder, body: bytes) -> bytes:
    """``body``, everything a finished ``encoder`` returned, as a file that states its length: a WAV's or a FLAC's
    header rewritten with the real sizes (the same number of bytes); the other formats carry no length."""
    inner = encoder.encoder if isinstance(encoder, TempoEncoder) else encoder
    if isinstance(inner, (WavStream, FlacStream)):
        header = inner.final_header()
        return header + body[len(header) :]
    return body


def with_speed(encoder: StreamEncoder, input_rate: int, speed: float) -> StreamEncoder:
    """``encoder`` speaking at ``speed`` (its input at ``input_rate``); at 1.0 ``encoder`` itself, untouched."""
    if speed == 1.0:
        return encoder
    return TempoEncoder(encoder, StreamTempo(input_rate, speed))


def make_encoder(
    fmt: AudioFormat | str,
    input_rate: int,
    *,
    output_rate: int | None = None,
    bitrate: int = DEFAULT_BITRATE,
    complexity: int = DEFAULT_COMPLEXITY,
    serial: int | None = None,
    speed: float = 1.0,
) -> StreamEncoder:
    """A fresh streaming encoder for one stream; ``bitrate``/``complexity`` only affect Opus, ``serial`` Ogg.
    ``speed`` (in [0.25, 4.0]) speaks the audio faster or slower at the same pitch (``audio/tempo.py``)."""
    return with_speed(
        _format_encoder(AudioFormat(fmt), input_rate, output_rate, bitrate, complexity, serial), input_rate, speed
    )


def _format_encoder(
    fmt: AudioFormat, input_rate: int, output_rate: int | None, bitrate: int, complexity: int, serial: int | None
) -> StreamEncoder:
    if fmt in (AudioFormat.OPUS, AudioFormat.OGG_OPUS):
        opus = OpusEncoder(input_rate, opus_rate=output_rate, bitrate=bitrate, complexity=complexity)
        return OpusPacketStream(opus) if fmt is AudioFormat.OPUS else OggOpusStream(opus, serial=serial)
    if fmt in (AudioFormat.PCM_MULAW, AudioFormat.PCM_ALAW):
        rate = TELEPHONY_RATE if output_rate is None else output_rate
        mulaw = fmt is AudioFormat.PCM_MULAW
        return PcmStream(input_rate, rate, to_mulaw if mulaw else to_alaw, "mulaw" if mulaw else "alaw")
    rate = input_rate if output_rate is None else output_rate
    if fmt is AudioFormat.PCM_S16LE:
        return PcmStream(input_rate, rate, to_s16le, "s16le")
    if fmt is AudioFormat.PCM_F32LE:
        return PcmStream(input_rate, rate, to_f32le, "f32le")
    if fmt is AudioFormat.WAV:
        return WavStream(input_rate, rate)
    if fmt is AudioFormat.MP3:
        return Mp3Stream(input_rate, rate)
    if fmt is AudioFormat.AAC:
        return AacStream(input_rate, rate)
    return FlacStream(input_rate, rate)
