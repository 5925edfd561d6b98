"""``ErrorCode``: the one set of stable error codes, shared by the WebSocket protocol and the HTTP API.

A client branches on these strings, never on messages. Each code states its HTTP status here, once:
the HTTP API answers with it (``http_api.ApiError``), and an engine failure (``service.SpeechFailure``)
maps to the same code on either transport. Codes that only the WebSocket sends have no HTTP status
(``http_status`` is None). stdlib only: clients import it through ``protocol``.
"""

from __future__ import annotations

import enum


class ErrorCode(str, enum.Enum):
    """Stable ``code`` of WebSocket ``error`` messages, close reasons and the HTTP error envelope."""

    http_status: int | None
    """The status of an HTTP response carrying this code; None for a code only the WebSocket sends."""

    def __new__(cls, value: str, http_status: int | None = None) -> ErrorCode:
        member = str.__new__(cls, value)
        member._value_ = value
        member.http_status = http_status
        return member

    # ---- both transports ----
    INVALID_JSON = ("invalid_json", 400)
    """Not UTF-8 JSON (a WebSocket text frame, or an HTTP body: undecodable, nested too deeply)."""
    UNKNOWN_FIELD = ("unknown_field", 400)
    TEXT_TOO_LONG = ("text_too_long", 400)
    """One ``text`` message, or an HTTP ``input``, voice ``transcript`` or ``name``, is over its limit."""
    UNKNOWN_VOICE = ("unknown_voice", 404)
    UNKNOWN_PERSONA = ("unknown_persona", 404)
    """A persona no LoRA of this server has (never loaded, or removed)."""
    BUSY = ("busy", 503)
    """A full engine queue, an engine at its real-time step budget (``--max-step-load``: a new stream), or no
    persona slot within ``--max-persona-wait-s`` (the utterance fails); new work over capacity is refused with HTTP
    503."""
    UNAVAILABLE = ("unavailable", 503)
    """The server is starting or shutting down (or its engine stopped) and takes no new utterances."""
    ENGINE_RESTARTED = ("engine_restarted", 503)
    """The engine died (crashed, killed, or ended as hung) and a new one is starting: an utterance it was speaking
    is cut, and new work is refused (HTTP 503 with ``Retry-After``) until the new engine serves. Retry shortly."""
    SYNTHESIS_FAILED = ("synthesis_failed", 422)
    """The engine refused the text (e.g. longer than a slot)."""
    INTERNAL_ERROR = ("internal_error", 500)
    """A server bug; see the server's log."""
    UNSUPPORTED = ("unsupported", 400)
    """A feature this model or voice does not have: ``instructions`` (voice design) on VoxCPM 0.5B/1.5, or
    with a voice saved with its transcript (a continuation prompt)."""

    # ---- WebSocket only ----
    INVALID_MESSAGE = "invalid_message"
    """JSON that is not an object with a string ``type``."""
    UNKNOWN_TYPE = "unknown_type"
    INVALID_FIELD = "invalid_field"
    """A field is missing or has the wrong JSON type."""
    OUT_OF_RANGE = "out_of_range"
    """A field's value is outside what the protocol or this server accepts."""
    BINARY_FRAME = "binary_frame"
    """The client sent a binary frame; clients only send JSON text frames."""
    MESSAGE_TOO_LARGE = "message_too_large"
    UTTERANCE_TOO_LONG = "utterance_too_long"
    """The utterance's text would exceed the server's per-utterance limit."""
    EMPTY_UTTERANCE = "empty_utterance"
    """``end`` with nothing to speak."""
    UTTERANCE_IN_PROGRESS = "utterance_in_progress"
    """``start`` while an utterance has text but no ``end`` yet."""
    SLOW_CONSUMER = "slow_consumer"
    IDLE_TIMEOUT = "idle_timeout"
    PROTOCOL_ERROR = "protocol_error"
    """A frame that breaks the WebSocket protocol (RFC 6455), e.g. an unmasked client frame; close code 1002."""
    RATE_LIMITED = "rate_limited"
    """The client sent more than ``max_messages_per_s`` messages a second (then close code 4003)."""
    TOO_MANY_UTTERANCES = "too_many_utterances"
    """A new utterance while ``max_queued_utterances`` of this connection are not done yet."""
    TOO_MANY_CONTEXTS = "too_many_contexts"
    """A message names a new context while ``max_contexts`` of this connection are open (``close_context`` one)."""
    BAD_FRAME = "bad_frame"
    """A binary audio frame that does not parse (raised by ``AudioFrame.decode``, on the client side)."""

    # ---- HTTP only ----
    INVALID_REQUEST = ("invalid_request", 400)
    """The body's shape, a field's type, or a form part is wrong."""
    EMPTY_INPUT = ("empty_input", 400)
    INVALID_NAME = ("invalid_name", 400)
    """A voice name with control or formatting characters."""
    UNSUPPORTED_FORMAT = ("unsupported_format", 400)
    UNSUPPORTED_STREAM_FORMAT = ("unsupported_stream_format", 400)
    INVALID_PARAMETER = ("invalid_parameter", 400)
    """``seed``, ``cfg_value``, ``inference_timesteps`` or ``speed`` out of range."""
    NORMALIZE_UNAVAILABLE = ("normalize_unavailable", 400)
    INVALID_AUDIO = ("invalid_audio", 400)
    """A voice clip that is unreadable, or not finite once encoded."""
    CLIP_TOO_LONG = ("clip_too_long", 400)
    TRANSCRIPT_REQUIRED = ("transcript_required", 400)
    UNAUTHORIZED = ("unauthorized", 401)
    FORBIDDEN_ORIGIN = ("forbidden_origin", 403)
    FORBIDDEN = ("forbidden", 403)
    """Another key's voice or persona, or an operator's (``--lora``) persona."""
    NOT_FOUND = ("not_found", 404)
    METHOD_NOT_ALLOWED = ("method_not_allowed", 405)
    BODY_TIMEOUT = ("body_timeout", 408)
    VOICE_LIMIT = ("voice_limit", 409)
    PAYLOAD_TOO_LARGE = ("payload_too_large", 413)
    UPLOAD_TOO_LARGE = ("upload_too_large", 413)
    NOT_READY = ("not_ready", 503)
    """Warming up (with ``Retry-After``)."""
    SHUTTING_DOWN = ("shutting_down", 503)

    # ---- HTTP, personas (``/v1/loras``) ----
    INVALID_PATH = ("invalid_path", 400)
    INVALID_LORA = ("invalid_lora", 400)
    LORA_TOO_LARGE = ("lora_too_large", 400)
    PERSONAS_UNAVAILABLE = ("personas_unavailable", 400)
    """This server has no personas (``--model sim``: no LoRA layers), or none can be added (started without
    ``--lora-root``)."""
    PERSONA_EXISTS = ("persona_exists", 409)
    PERSONA_LIMIT = ("persona_limit", 409)
