"""Typed errors shared by the library, the server and the CLI. Each message says what was wrong and how to fix it."""

from __future__ import annotations


class VoxwireError(Exception):
    """Base class of every error voxwire raises on purpose."""


class ModelLoadError(VoxwireError):
    """A checkpoint could not be found, read or matched to its config; the message names the file."""


class InvalidInputError(VoxwireError, ValueError):
    """A request argument (text, prompt, generation parameter) is unusable; the message names it."""
