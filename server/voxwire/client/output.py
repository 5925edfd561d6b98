"""Where ``voxwire say`` puts audio: a binary stream (stdout or a file) in a chosen format, or the speakers.

The server streams ``pcm_s16le``, ``pcm_f32le`` or ``ogg_opus`` bytes that are written as they come;
``wav`` is s16le behind the streaming header of ``voxwire.audio.pcm`` (sizes unknown), rewritten
with the real sizes at the end when the file can seek. Speakers use ``sounddevice`` (the optional
``speakers`` extra), imported only when wanted.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, BinaryIO, Protocol

from voxwire.audio.pcm import wav_header
from voxwire.client.errors import OutputUnavailableError

OUTPUT_FORMATS = ("wav", "pcm_s16le", "pcm_f32le", "ogg_opus", "opus")
FORMAT_ALIASES = {"opus": "ogg_opus"}
"""A file of Opus is Ogg Opus, as OpenAI's ``response_format`` names it (raw Opus packets need framing)."""
SPEAKER_FORMAT = "pcm_f32le"
_EXTENSIONS = {".wav": "wav", ".ogg": "ogg_opus", ".opus": "ogg_opus", ".oga": "ogg_opus"}
INSTALL_HINT = (
    "install speaker support with `pip install 'voxwire[speakers]'` (and PortAudio: `apt-get install "
    "libportaudio2`), or write the audio elsewhere: `--out FILE.wav`, or `--out - --format pcm_s16le | "
    "aplay -f S16_LE -r 48000 -c 1`"
)


class AudioSink(Protocol):
    """Receives one utterance's audio bytes in order; ``open`` comes first, with the stream's sample rate."""

    wire_format: str
    """The format to ask the server for."""

    def open(self, sample_rate: int) -> None: ...

    def write(self, data: bytes) -> None: ...

    def close(self) -> None: ...


def format_for(out: str | None, requested: str | None) -> str:
    """``--format`` if given, else from the file extension, else WAV (self-describing, plays anywhere)."""
    if requested is not None:
        return FORMAT_ALIASES.get(requested, requested)
    return _EXTENSIONS.get(Path(out).suffix.lower(), "wav") if out not in (None, "-") else "wav"


class StreamSink:
    """Bytes to a binary stream, flushed per write so a pipe's reader gets audio as it comes."""

    def __init__(self, stream: BinaryIO, output_format: str, *, owned: bool = False) -> None:
        self.stream = stream
        self.output_format = output_format
        self.owned = owned
        # WAV is s16le from the server, framed here.
        self.wire_format = "pcm_s16le" if output_format == "wav" else output_format
        self.sample_rate = 0
        self._data_bytes = 0

    def open(self, sample_rate: int) -> None:
        self.sample_rate = sample_rate
        if self.output_format == "wav":
            self.stream.write(wav_header(sample_rate))

    def write(self, data: bytes) -> None:
        self.stream.write(data)
        self.stream.flush()
        self._data_bytes += len(data)

    def close(self) -> None:
        if self.output_format == "wav" and self.sample_rate and self.stream.seekable():
            self.stream.seek(0)
            self.stream.write(wav_header(self.sample_rate, self._data_bytes // 2))
        self.stream.flush()
        if self.owned:
            self.stream.close()


class SpeakerSink:
    """Plays float32 mono through the default output device; ``close`` returns once everything was heard."""

    wire_format = SPEAKER_FORMAT

    def __init__(self, sounddevice: ModuleType) -> None:
        self.sounddevice = sounddevice
        self.stream: Any = None

    def open(self, sample_rate: int) -> None:
        self.stream = self.sounddevice.RawOutputStream(samplerate=sample_rate, channels=1, dtype="float32")
        self.stream.start()

    def write(self, data: bytes) -> None:
        self.stream.write(data)

    def close(self) -> None:
        if self.stream is not None:
            self.stream.stop()  # waits until the buffered audio has played
            self.stream.close()


def speakers() -> SpeakerSink | None:
    """A sink on the default output device, or None without ``sounddevice``, PortAudio or a device."""
    try:
        sounddevice = importlib.import_module("sounddevice")  # optional: the `speakers` extra
    except (ImportError, OSError):  # OSError: the module is there but PortAudio is not
        return None
    try:
        sounddevice.query_devices(kind="output")
    except Exception:  # PortAudioError or ValueError: no default output device
        return None
    return SpeakerSink(sounddevice)


def choose_sink(out: str | None, output_format: str, *, stdout: BinaryIO | None = None) -> AudioSink:
    """``--out FILE``, ``--out -`` (stdout), or, without ``--out``: speakers, else stdout when it is not a terminal."""
    stdout = sys.stdout.buffer if stdout is None else stdout
    if out == "-":
        return StreamSink(stdout, output_format)
    if out is not None:
        try:
            return StreamSink(open(out, "wb"), output_format, owned=True)  # closed by StreamSink.close
        except OSError as exc:
            raise OutputUnavailableError(f"cannot write {out}: {exc.strerror}") from None
    sink = speakers()
    if sink is not None:
        return sink
    if not stdout.isatty():
        return StreamSink(stdout, output_format)
    raise OutputUnavailableError(f"no audio output device to play through: {INSTALL_HINT}")
