"""A PyAV (FFmpeg) audio encoder for one mono stream: float32 chunks in, compressed packets out.

PyAV bundles FFmpeg with LAME, its native AAC encoder and its FLAC encoder, so one library covers
the three compressed formats the OpenAI endpoint serves; ``audio/mp3.py``, ``audio/aac.py`` and
``audio/flac.py`` only add each format's framing around the packets. PyAV re-blocks the chunks into
the codec's frame size itself, so a packet comes out as soon as a codec frame is complete: the
formats stream with at most one codec frame (1152 / 1024 / 4608 samples) held back.
"""

from __future__ import annotations

import av
import numpy as np

from voxwire.audio.pcm import S16_SCALE, as_mono_float32
from voxwire.audio.resample import StreamResampler


class PacketEncoder:
    """Encode float32 mono chunks at ``input_rate`` with FFmpeg's ``codec`` at ``output_rate``.

    ``sample_format`` is the codec's input format: ``"fltp"`` (float) or ``"s16"``, which is
    quantised here exactly as the PCM formats are (``to_s16le``'s rounding), so a lossless codec
    decodes to the same samples as ``pcm``/``wav``.
    """

    def __init__(
        self, codec: str, input_rate: int, output_rate: int, *, sample_format: str, bitrate: int | None = None
    ) -> None:
        self.sample_rate = output_rate
        self._resampler = StreamResampler(input_rate, output_rate)
        self._format = sample_format
        context = av.CodecContext.create(codec, "w")
        if not isinstance(context, av.AudioCodecContext):
            raise ValueError(f"{codec} is not an audio codec")
        self._context = context
        self._context.sample_rate = output_rate
        self._context.layout = "mono"
        self._context.format = sample_format
        if bitrate is not None:
            self._context.bit_rate = bitrate
        self._context.open()
        self.extradata = bytes(self._context.extradata or b"")
        """The codec's configuration as FFmpeg sets it at open (FLAC's STREAMINFO, AAC's AudioSpecificConfig)."""
        self.final_extradata = self.extradata
        """The configuration once ``finish`` has flushed the codec: FFmpeg's FLAC encoder then sends its STREAMINFO
        again with the real sample count, frame sizes and MD5 (the packet's ``new_extradata`` side data)."""
        self._pts = 0
        self._finished = False

    def encode(self, chunk: np.ndarray) -> list[bytes]:
        """The packets completed by this chunk (often none for a short chunk)."""
        self._check_open()
        return self._encode(self._resampler.process(chunk))

    def finish(self) -> list[bytes]:
        """Flush the resampler and the codec (its last, padded frame); the encoder is then closed."""
        self._check_open()
        packets = self._encode(self._resampler.flush())
        self._finished = True
        flushed = self._context.encode(None)
        for packet in flushed:
            for side_data in packet.iter_sidedata():
                if side_data.data_type == "new_extradata":
                    self.final_extradata = bytes(side_data)
        return packets + _payloads(flushed)

    def _encode(self, samples: np.ndarray) -> list[bytes]:
        if samples.size == 0:
            return []
        clipped = np.clip(as_mono_float32(samples), -1.0, 1.0)
        data = np.rint(clipped * S16_SCALE).astype(np.int16) if self._format == "s16" else clipped
        frame = av.AudioFrame.from_ndarray(data[np.newaxis, :], format=self._format, layout="mono")
        frame.sample_rate = self.sample_rate
        frame.pts = self._pts
        self._pts += samples.size
        return _payloads(self._context.encode(frame))

    def _check_open(self) -> None:
        if self._finished:
            raise RuntimeError("encoder already finished")


def _payloads(packets: list[av.Packet]) -> list[bytes]:
    # FLAC's flush ends with an empty packet that only carries the final STREAMINFO as side data.
    return [payload for payload in map(bytes, packets) if payload]
