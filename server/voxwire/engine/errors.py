"""Exceptions the engine raises to its callers.

Each error says what was refused and why, so the serving layer can turn it into a close reason
without parsing messages. Errors of a single request *during* synthesis are not exceptions: they
finish that request with ``FinishReason.ERROR`` and a message (see ``voxwire.chunk.Chunk``).
"""

from __future__ import annotations


class EngineError(Exception):
    """Base class of every error raised by ``voxwire.engine``."""


class QueueFullError(EngineError):
    """The bounded waiting queue is full; the request was not added (retry later or shed load)."""


class OverBudgetError(QueueFullError):
    """A new stream was refused because the engine's committed streams fill its step budget (``engine.policy``,
    rule 7). A refusal of the same kind as a full queue (retry later, or on another replica), so every transport
    answers it as one: ``busy``, with ``Retry-After`` over HTTP."""


class DuplicateRequestError(EngineError, ValueError):
    """A request with the same id is still waiting or running."""


class EngineDeadError(EngineError):
    """The engine thread is not running (never started, stopped, or died); no output will come."""


class EngineRestartingError(EngineDeadError):
    """The engine (its thread, or its process under ``--workers``) died or was ended as hung, and the server is
    starting its replacement: a request it ran was cut, and new requests are refused until the replacement
    serves. Retrying shortly succeeds."""
