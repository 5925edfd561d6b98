"""Benchmark (not a test): Opus encode CPU and decoded quality on real speech, per complexity and bitrate.

    python scripts/bench_opus.py [--complexities 0-10] [--bitrates 32000,64000] [--seconds 20] [--json out.json]

espeak-ng speaks a paragraph; soxr resamples it to 48 kHz (VoxCPM2's rate); the server's own
per-session encoder (``OpusEncoder``: 20 ms frames) is fed 160 ms chunks, as the engine emits them, and
the CPU time of its thread is measured (best of ``--repeats``) per second of audio. The packets are
decoded with libopus (``opuslib``), the pre-skip dropped, and compared with the source by the
magnitude-spectrum SNR of ``voxwire.audio.quality`` (phase-blind: what a listener hears).

Needs, besides ``voxwire[server]``: ``opuslib`` (an independent libopus binding: ``pip install opuslib``, or the dev
extra), the system's libopus it loads (``apt-get install libopus0``; it has no copy of its own) and ``espeak-ng``.
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import opuslib
import soundfile
import soxr

from voxwire.audio.opus import OpusEncoder
from voxwire.audio.quality import spectral_snr_db

RATE = 48000
CHUNK = 7680
"""160 ms at 48 kHz: one VoxCPM2 patch."""
TEXT = (
    "The committee met on Tuesday to review the budget for next year. After a long discussion, they agreed "
    "to fund the new library, repair the roads near the river, and hire three more teachers for the school. "
    "Several residents asked questions about taxes, and the mayor promised a public meeting in the spring. "
    "Everyone left a little tired, but most people seemed satisfied with the result."
)


def speech(seconds: float) -> np.ndarray:
    """At least ``seconds`` of espeak-ng speech at 48 kHz (the paragraph, repeated)."""
    if shutil.which("espeak-ng") is None:
        raise SystemExit("espeak-ng is not installed (apt-get install espeak-ng)")
    wav = subprocess.run(["espeak-ng", "--stdout", TEXT], check=True, capture_output=True).stdout
    samples, rate = soundfile.read(io.BytesIO(wav), dtype="float32")
    samples = soxr.resample(samples, rate, RATE, quality="VHQ").astype(np.float32)
    repeats = int(np.ceil(seconds * RATE / samples.size))
    return np.tile(samples, repeats)[: int(seconds * RATE)]


def encode(source: np.ndarray, bitrate: int, complexity: int) -> tuple[list[bytes], float, int]:
    """The packets, the encoder thread's CPU seconds, and the pre-skip."""
    encoder = OpusEncoder(RATE, bitrate=bitrate, complexity=complexity)
    packets: list[bytes] = []
    started = time.thread_time()
    for start in range(0, source.size, CHUNK):
        packets += encoder.encode(source[start : start + CHUNK])
    packets += encoder.finish()
    return packets, time.thread_time() - started, encoder.pre_skip


def decode(packets: list[bytes], pre_skip: int) -> np.ndarray:
    decoder = opuslib.Decoder(RATE, 1)
    pcm = b"".join(decoder.decode_float(packet, RATE // 50) for packet in packets)
    return np.frombuffer(pcm, dtype=np.float32)[pre_skip:]


def measure(source: np.ndarray, bitrate: int, complexity: int, repeats: int) -> dict[str, float]:
    cpu = []
    for _ in range(repeats):
        packets, seconds, pre_skip = encode(source, bitrate, complexity)
        cpu.append(seconds)
    decoded = decode(packets, pre_skip)
    audio_s = source.size / RATE
    return {
        "bitrate": bitrate,
        "complexity": complexity,
        "cpu_ms_per_audio_s": 1e3 * min(cpu) / audio_s,
        "spectral_snr_db": spectral_snr_db(source, decoded),
        "kbps": 8 * sum(len(p) for p in packets) / audio_s / 1e3,
    }


def int_list(text: str) -> list[int]:
    if "-" in text and "," not in text:
        low, high = (int(part) for part in text.split("-"))
        return list(range(low, high + 1))
    return [int(part) for part in text.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--complexities", type=int_list, default=list(range(11)), help="e.g. 0-10 or 0,5,10")
    parser.add_argument("--bitrates", type=int_list, default=[32000, 64000])
    parser.add_argument("--seconds", type=float, default=20.0, help="speech per measurement")
    parser.add_argument("--repeats", type=int, default=3, help="CPU time is the best of this many runs")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    source = speech(args.seconds)
    rows = [measure(source, b, c, args.repeats) for b in args.bitrates for c in args.complexities]
    print("| bitrate (kb/s) | complexity | encode CPU (ms per audio s) | spectral SNR (dB) | actual kb/s |")
    print("|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['bitrate'] // 1000} | {row['complexity']} | {row['cpu_ms_per_audio_s']:.2f} "
            f"| {row['spectral_snr_db']:.1f} | {row['kbps']:.1f} |"
        )
    if args.json is not None:
        args.json.write_text(json.dumps({"rows": rows}, indent=1))


if __name__ == "__main__":
    main()
