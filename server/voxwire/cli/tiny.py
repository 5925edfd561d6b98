"""``voxwire make-tiny-checkpoint``: write a small random checkpoint in the published file layout."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(parser: argparse.ArgumentParser) -> None:
    from voxwire.tiny.configs import ALL_CONFIGS

    parser.description = (
        "Writes config.json, model weights, audiovae.pth and tokenizer files, exactly as the "
        "published checkpoints lay them out, with deterministic random weights. Its audio is noise."
    )
    parser.add_argument("directory", type=Path)
    parser.add_argument("--architecture", choices=("voxcpm", "voxcpm2"), default="voxcpm2")
    parser.add_argument("--config", choices=sorted(ALL_CONFIGS), help="a named shape (overrides --architecture)")
    parser.add_argument("--seed", type=int, default=0)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from voxwire.tiny.checkpoint import DEFAULT_FOR_ARCHITECTURE, make_tiny_checkpoint

    name = args.config or DEFAULT_FOR_ARCHITECTURE[args.architecture]
    path = make_tiny_checkpoint(args.directory, name, seed=args.seed)
    print(f"wrote {name} checkpoint to {path}")
    return 0
