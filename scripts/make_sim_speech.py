"""Render the simulated model's speech clip once: espeak-ng speaks a paragraph, our Ogg Opus encoder packs it.

    python scripts/make_sim_speech.py [--out server/voxwire/sim/speech.opus]

``voxwire serve --model sim`` loops this clip for every session, so load tests carry real speech
(Opus costs differ between speech and tones) without espeak-ng at run time. The output is committed;
rerun this only to change the clip. Needs ``espeak-ng`` on the PATH.
"""

from __future__ import annotations

import argparse
import io
import shutil
import subprocess
from pathlib import Path

import soundfile

from voxwire.audio.formats import AudioFormat, make_encoder
from voxwire.audio.opus import GRANULE_RATE

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "server" / "voxwire" / "sim" / "speech.opus"
TEXT = (
    "Streaming speech arrives a little at a time, so the listener never waits for the whole answer. "
    "Each voice keeps its own pace, and the server keeps every stream ahead of its player. "
    "When the network slows down, a short buffer hides the gap."
)
BITRATE = 24000
"""Enough for espeak's narrow-band voice; keeps the packaged file near 40 KB."""


def render(text: str) -> tuple[bytes, int]:
    """espeak-ng's WAV of ``text`` and its sample rate."""
    if shutil.which("espeak-ng") is None:
        raise SystemExit("espeak-ng is not installed (apt-get install espeak-ng)")
    wav = subprocess.run(["espeak-ng", "--stdout", "-s", "165", text], check=True, capture_output=True).stdout
    return wav, soundfile.info(io.BytesIO(wav)).samplerate


def encode_ogg_opus(wav: bytes) -> bytes:
    samples, rate = soundfile.read(io.BytesIO(wav), dtype="float32")
    encoder = make_encoder(AudioFormat.OGG_OPUS, rate, output_rate=GRANULE_RATE, bitrate=BITRATE, serial=1)
    return b"".join(encoder.encode(samples) + encoder.finish())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    wav, rate = render(TEXT)
    data = encode_ogg_opus(wav)
    args.out.write_bytes(data)
    seconds = soundfile.info(str(args.out)).duration
    print(f"{args.out}: {len(data)} bytes, {seconds:.1f} s of speech (espeak-ng at {rate} Hz, Opus {BITRATE} b/s)")


if __name__ == "__main__":
    main()
