"""The ``voxwire`` command: one entry point, one module per subcommand."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from voxwire import __version__

# Each subcommand module exposes ``register(subparsers) -> None`` and sets ``func`` on its parser.
_SUBCOMMANDS = (
    "voxwire.cli.synth",
    "voxwire.cli.tiny",
    "voxwire.cli.serve",
    "voxwire.cli.say",
    "voxwire.cli.bench",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="voxwire", description="Real-time VoxCPM text-to-speech.")
    parser.add_argument("--version", action="version", version=f"voxwire {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    import importlib

    for name in _SUBCOMMANDS:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    from voxwire.errors import VoxwireError

    try:
        return func(args)
    except VoxwireError as exc:
        print(f"voxwire {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
