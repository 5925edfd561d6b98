"""The ``voxwire`` command: one entry point, one module per subcommand, imported only when that subcommand runs.

A client-only install (``pip install voxwire``) has no torch, aiohttp or PyAV: ``say`` and ``bench`` must run
there, so only the requested subcommand's module is imported and registers its arguments; the others are listed
by name and summary. The server's subcommands first check that the ``server`` extra is installed.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from voxwire import __version__

SERVER_EXTRA_MODULES = (
    "torch", "safetensors", "tokenizers", "soundfile", "huggingface_hub", "aiohttp", "prometheus_client", "av", "zmq",
)  # fmt: skip
"""What the ``server`` extra of pyproject.toml installs, by import name (uvloop is optional: asyncio's loop serves
without it). tests/cli/test_lazy_cli.py holds the two lists equal."""
SERVER_INSTALL = "pip install 'voxwire[server]'"


@dataclass(frozen=True, slots=True)
class Subcommand:
    name: str
    module: str
    """Exposes ``register(parser) -> None``, which adds the arguments and sets ``func`` on the parser."""
    summary: str
    needs_server: bool
    """Runs the model or the server: needs the ``server`` extra."""


SUBCOMMANDS = (
    Subcommand("synth", "voxwire.cli.synth", "synthesize text to an audio file, offline", needs_server=True),
    Subcommand(
        "make-tiny-checkpoint",
        "voxwire.cli.tiny",
        "write a small random VoxCPM checkpoint (tests, demos, benchmarks)",
        needs_server=True,
    ),
    Subcommand(
        "serve",
        "voxwire.cli.serve",
        "run the streaming TTS server (WebSocket, OpenAI-compatible HTTP, metrics)",
        needs_server=True,
    ),
    Subcommand(
        "say", "voxwire.cli.say", "speak text through a voxwire server (speakers, file or stdout)", needs_server=False
    ),
    Subcommand(
        "bench",
        "voxwire.cli.bench",
        "measure latency and throughput of a voxwire server under load",
        needs_server=False,
    ),
)


def build_parser(commands: Collection[str] | None = None) -> argparse.ArgumentParser:
    """The parser with the arguments of ``commands`` (default: every subcommand); the others by name only."""
    parser = argparse.ArgumentParser(prog="voxwire", description="Real-time VoxCPM text-to-speech.")
    parser.add_argument("--version", action="version", version=f"voxwire {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in SUBCOMMANDS:
        subparser = subparsers.add_parser(command.name, help=command.summary)
        if commands is None or command.name in commands:
            importlib.import_module(command.module).register(subparser)
    return parser


def missing_server_modules() -> list[str]:
    """The ``server`` extra's modules that are not installed (found without importing them)."""
    return [name for name in SERVER_EXTRA_MODULES if importlib.util.find_spec(name) is None]


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # Top-level options take no values, so the first word that is not an option names the subcommand.
    requested = next((word for word in argv if not word.startswith("-")), None)
    command = next((command for command in SUBCOMMANDS if command.name == requested), None)
    if command is not None and command.needs_server and (missing := missing_server_modules()):
        print(
            f"voxwire {command.name}: error: needs the server extra ({', '.join(missing)} not installed): "
            f"{SERVER_INSTALL}",
            file=sys.stderr,
        )
        return 2
    args = build_parser(() if command is None else (command.name,)).parse_args(argv)
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
