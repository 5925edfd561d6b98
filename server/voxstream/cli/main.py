"""The ``voxstream`` command: one entry point, one module per subcommand."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from voxstream import __version__

# Each subcommand module exposes ``register(subparsers) -> None`` and sets ``func`` on its parser.
_SUBCOMMANDS = (
    "voxstream.cli.synth",
    "voxstream.cli.tiny",
    "voxstream.cli.serve",
    "voxstream.cli.say",
    "voxstream.cli.bench",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="voxstream", description="Real-time VoxCPM text-to-speech.")
    parser.add_argument("--version", action="version", version=f"voxstream {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    import importlib

    for name in _SUBCOMMANDS:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    from voxstream.errors import VoxstreamError

    try:
        return func(args)
    except VoxstreamError as exc:
        print(f"voxstream {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
