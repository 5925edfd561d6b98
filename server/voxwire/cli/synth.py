"""``voxwire synth``: offline synthesis of one utterance to an audio file."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from voxwire.params import SynthesisParams


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Synthesize one utterance with a local or Hugging Face VoxCPM checkpoint and write it to a "
        "file (the extension picks WAV, FLAC or OGG)."
    )
    parser.add_argument(
        "--model",
        default="demo",
        help="checkpoint folder, Hugging Face id (e.g. openbmb/VoxCPM2), or 'demo' (tiny random "
        "model: noise, for trying the pipeline)",
    )
    parser.add_argument("--text", help="text to speak (default: read standard input)")
    parser.add_argument("--prompt-audio", type=Path, help="voice clip to continue (needs --prompt-text)")
    parser.add_argument("--prompt-text", help="transcript of --prompt-audio")
    parser.add_argument("--reference-audio", type=Path, help="voice clip to clone in isolation (VoxCPM2)")
    parser.add_argument(
        "--normalize",
        action="store_true",
        help="read numbers, dates and money as words first (needs pip install 'voxwire[normalize]')",
    )
    parser.add_argument(
        "--lora", type=Path, help="LoRA persona: a checkpoint folder in the reference's fine-tuning format"
    )
    parser.add_argument("--seed", type=int, help="random seed (same seed, same audio)")
    defaults = SynthesisParams()
    parser.add_argument(
        "--cfg", type=float, default=defaults.cfg_value, help="classifier-free guidance strength (default %(default)s)"
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=defaults.inference_timesteps,
        help="diffusion steps per patch (default %(default)s)",
    )
    parser.add_argument(
        "--min-len", type=int, default=defaults.min_len, help="patches before a stop is allowed (default %(default)s)"
    )
    parser.add_argument(
        "--max-len", type=int, default=defaults.max_len, help="cap on generated patches (default %(default)s)"
    )
    parser.add_argument("--device", help="cuda, cpu, ... (default: cuda when available)")
    parser.add_argument("--dtype", help="bfloat16 or float32 (default: bfloat16 on CUDA, float32 on CPU)")
    parser.add_argument("--out", type=Path, required=True, help="output file: .wav, .flac or .ogg")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import soundfile

    from voxwire.errors import InvalidInputError
    from voxwire.loader import load_model
    from voxwire.voice_clip import VoiceClip

    text = args.text if args.text is not None else sys.stdin.read()
    if args.normalize:
        from voxwire.text.normalize import normalize

        text = normalize(text)
    if (args.prompt_audio is None) != (args.prompt_text is None):
        raise InvalidInputError("--prompt-audio and --prompt-text go together")
    if args.out.suffix.lower() not in (".wav", ".flac", ".ogg"):
        raise InvalidInputError(f"--out must end in .wav, .flac or .ogg, got {args.out.name!r}")
    model = load_model(args.model, device=args.device, dtype=args.dtype)
    prompt = None
    if args.prompt_audio is not None or args.reference_audio is not None:
        clip = VoiceClip(text=args.prompt_text, audio=args.prompt_audio, reference_audio=args.reference_audio)
        prompt = model.make_prompt(clip)
    params = SynthesisParams(
        cfg_value=args.cfg, inference_timesteps=args.steps, min_len=args.min_len, max_len=args.max_len, seed=args.seed
    )
    audio = model.generate(text, params, prompt=prompt, progress=not args.quiet, lora=args.lora)
    soundfile.write(str(args.out), audio, model.sample_rate)
    print(f"wrote {audio.size / model.sample_rate:.2f} s at {model.sample_rate} Hz to {args.out}", file=sys.stderr)
    return 0
