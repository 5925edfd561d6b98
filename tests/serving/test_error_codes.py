"""One ``ErrorCode`` for both transports: README documents every code, each HTTP code at its own status."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from voxwire.serving.error_codes import ErrorCode
from voxwire.serving.http_api import ApiError, as_api_error
from voxwire.serving.service import SpeechFailure

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def _readme_http_table() -> dict[str, int]:
    """Each code in README's HTTP error table, with the status of its row."""
    statuses: dict[str, int] = {}
    for status, codes in re.findall(r"^\| ([45]\d\d) \| (.+) \|$", README, flags=re.MULTILINE):
        for code in re.findall(r"`([a-z_]+)`", codes):
            if code in ErrorCode._value2member_map_:
                statuses.setdefault(code, int(status))
    return statuses


def test_readme_http_table_lists_every_http_code_at_its_status() -> None:
    expected = {code.value: code.http_status for code in ErrorCode if code.http_status is not None}
    assert _readme_http_table() == expected


@pytest.mark.parametrize("code", [code for code in ErrorCode if code.http_status is None], ids=str)
def test_readme_documents_every_websocket_code(code: ErrorCode) -> None:
    assert f"`{code.value}`" in README


def test_an_http_error_takes_its_codes_status() -> None:
    error = ApiError(ErrorCode.VOICE_LIMIT, "too many")
    assert error.status == 409
    assert error.response().status == 409


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
