"""The shipped image read as data: the Dockerfile's instructions and the environment it sets, and the variables
``voxwire serve`` reads (what the compose file and the Kubernetes manifests may set)."""

from __future__ import annotations

import argparse
import re
import shlex

from tests.deploy.fleet import DEPLOY

from voxwire.cli import environment
from voxwire.cli.main import build_parser


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = (DEPLOY / "Dockerfile").read_text()
    return [(keyword.upper(), value) for keyword, value in (line.split(None, 1) for line in _logical_lines(text))]


def image_environment() -> dict[str, str]:
    pairs = [shlex.split(value) for keyword, value in dockerfile_instructions() if keyword == "ENV"]
    return dict(pair.split("=", 1) for line in pairs for pair in line)


def serve_variables() -> set[str]:
    subparsers = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {environment.variable(action) for action in environment.options(subparsers.choices["serve"])}


def _logical_lines(text: str) -> list[str]:
    """Dockerfile instructions with their backslash continuations joined, comments left out."""
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    return [line.strip() for line in re.sub(r"\\\n", " ", "\n".join(lines)).splitlines() if line.strip()]
