"""ElevenLabs' ``output_format`` names (``pcm_<rate>``, ``ulaw_8000``, ``alaw_8000``, ``mp3_<rate>_<kbps>``,
``opus_48000_<kbps>``: Ogg Opus, as ElevenLabs sends it) and the encoder each stands for, shared by the ElevenLabs
WebSocket endpoints and the HTTP text-to-speech routes."""

from __future__ import annotations

import re
from dataclasses import dataclass

from voxwire.audio.formats import AudioFormat, StreamEncoder, make_encoder, with_speed
from voxwire.audio.mp3 import Mp3Stream
from voxwire.audio.opus import DEFAULT_BITRATE

DEFAULT_OUTPUT_FORMAT = "mp3_44100_128"
"""ElevenLabs' default when the query names none."""

PCM_RATES = (8000, 16000, 22050, 24000, 32000, 44100, 48000)
MP3_FORMATS = {
    "mp3_22050_32": (22050, 32),
    "mp3_24000_48": (24000, 48),
    "mp3_44100": (44100, 128),
    "mp3_44100_32": (44100, 32),
    "mp3_44100_64": (44100, 64),
    "mp3_44100_96": (44100, 96),
    "mp3_44100_128": (44100, 128),
    "mp3_44100_192": (44100, 192),
}
"""ElevenLabs' mp3 formats: (sample rate, kb/s)."""
OPUS_KBPS = (32, 64, 96, 128, 192)
"""The bit rates of ElevenLabs' ``opus_48000_<kbps>`` formats (Ogg Opus at 48 kHz)."""
OPUS_RATE = 48000
_G711 = {"ulaw_8000": AudioFormat.PCM_MULAW, "alaw_8000": AudioFormat.PCM_ALAW}
_PCM = re.compile(r"pcm_(\d+)")


@dataclass(frozen=True)
class OutputFormat:
    """An ElevenLabs ``output_format``: how this server encodes it."""

    name: str
    codec: AudioFormat
    sample_rate: int
    kbps: int | None = None
    """mp3 and opus: the bit rate."""

    def encoder(self, model_rate: int, speed: float = 1.0) -> StreamEncoder:
        """A fresh encoder for one context's audio (float32 at ``model_rate`` in), spoken at ``speed`` (the tempo
        changes, the pitch is kept: ``audio/tempo.py``)."""
        bitrate = DEFAULT_BITRATE if self.kbps is None else self.kbps * 1000
        if self.codec is AudioFormat.MP3:
            return with_speed(Mp3Stream(model_rate, self.sample_rate, bitrate=bitrate), model_rate, speed)
        return make_encoder(self.codec, model_rate, output_rate=self.sample_rate, bitrate=bitrate, speed=speed)


def supported_formats() -> list[str]:
    return [*(f"pcm_{rate}" for rate in PCM_RATES), *_G711, *MP3_FORMATS, *(_opus(kbps) for kbps in OPUS_KBPS)]


def _opus(kbps: int) -> str:
    return f"opus_{OPUS_RATE}_{kbps}"


def parse_output_format(name: str) -> OutputFormat:
    """The format an ``output_format`` names. Raises ``ValueError`` for one this server does not make."""
    if (match := _PCM.fullmatch(name)) is not None and int(match.group(1)) in PCM_RATES:
        return OutputFormat(name, AudioFormat.PCM_S16LE, int(match.group(1)))
    if name in _G711:
        return OutputFormat(name, _G711[name], 8000)
    if name in MP3_FORMATS:
        rate, kbps = MP3_FORMATS[name]
        return OutputFormat(name, AudioFormat.MP3, rate, kbps)
    for kbps in OPUS_KBPS:
        if name == _opus(kbps):
            return OutputFormat(name, AudioFormat.OGG_OPUS, OPUS_RATE, kbps)
    raise ValueError(f"output_format {name!r} is not supported here; use one of {', '.join(supported_formats())}")
