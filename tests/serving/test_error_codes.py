"""One ``ErrorCode`` for both transports: the docs document every code, each HTTP code at its own status."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from voxwire.protocol.error_codes import ErrorCode
from voxwire.serving.edge.api_errors import ApiError, as_api_error
from voxwire.serving.speech.service import SpeechFailure

DOCS = Path(__file__).resolve().parents[2] / "docs"
HTTP_API = (DOCS / "http-api.md").read_text()
PROTOCOL = (DOCS / "protocol.md").read_text()


def _http_error_table() -> dict[str, int]:
    """Each code in docs/http-api.md's error table, with the status of its row."""
    statuses: dict[str, int] = {}
    for status, codes in re.findall(r"^\| ([45]\d\d) \| (.+) \|$", HTTP_API, flags=re.MULTILINE):
        for code in re.findall(r"`([a-z_]+)`", codes):
            if code in ErrorCode._value2member_map_:
                statuses.setdefault(code, int(status))
    return statuses


def test_http_error_table_lists_every_http_code_at_its_status() -> None:
    expected = {code.value: code.http_status for code in ErrorCode if code.http_status is not None}
    assert _http_error_table() == expected


@pytest.mark.parametrize("code", [code for code in ErrorCode if code.http_status is None], ids=str)
def test_protocol_documents_every_websocket_code(code: ErrorCode) -> None:
    assert f"`{code.value}`" in PROTOCOL


def test_an_http_error_takes_its_codes_status() -> None:
    error = ApiError(ErrorCode.VOICE_LIMIT, "too many")
    assert error.status == 409
    response = error.response("req_1")
    assert response.status == 409
    assert response.text is not None
    assert json.loads(response.text) == {"error": {"code": "voice_limit", "message": "too many", "request_id": "req_1"}}


def test_a_websocket_only_code_cannot_be_an_http_error() -> None:
    with pytest.raises(ValueError, match="WebSocket-only"):
        ApiError(ErrorCode.SLOW_CONSUMER, "no")


@pytest.mark.parametrize(
    ("code", "status"), [(ErrorCode.BUSY, 503), (ErrorCode.UNAVAILABLE, 503), (ErrorCode.SYNTHESIS_FAILED, 422)]
)
def test_an_engine_failure_maps_through_the_same_code_over_http(code: ErrorCode, status: int) -> None:
    error = as_api_error(SpeechFailure(code, "failed"))
    assert error is not None
    assert (error.code, error.status) == (code, status)
