"""``FinishReason``: why a stream of speech ended, one vocabulary for the engine and the wire protocol.

stdlib only: the protocol (and so every client) imports it without the engine. The engine ends a request
with ``stop``, ``length``, ``aborted``, ``busy`` or ``error``; a WebSocket utterance's ``done.finish_reason`` is
``stop``, ``length``, ``cancelled`` or ``error`` (the session reports a cancel it asked for as ``cancelled``,
and an engine abort, like any failure, as ``error`` after an ``error`` message).
"""

from __future__ import annotations

import enum


class FinishReason(str, enum.Enum):
    """Why a stream ended: the engine's last chunk of a request, or ``done.finish_reason`` of an utterance."""

    STOP = "stop"
    """The model stopped by itself (for an utterance: every segment did)."""
    LENGTH = "length"
    """The length cap was hit (for an utterance: by at least one segment)."""
    ABORTED = "aborted"
    """Engine only: the request was aborted (cancelled, or the engine shut down)."""
    BUSY = "busy"
    """Engine only: the request waited longer than its bound for a LoRA persona slot and never ran (a retryable
    refusal, like a full queue)."""
    CANCELLED = "cancelled"
    """Protocol only: the client cancelled the utterance."""
    ERROR = "error"
    """The request failed (for an utterance: an ``error`` message with the cause came before the ``done``)."""
