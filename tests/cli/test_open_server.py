"""A server without API keys listens on loopback only, unless ``--no-auth`` says an open server is meant (security
probe 4, F7: the image binds 0.0.0.0, and a missing key list used to give an open server with nothing logged)."""

from __future__ import annotations

import logging

import pytest

from voxwire.cli.main import main
from voxwire.serving.server_config import ServerConfig


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[ServerConfig]:
    """The configs ``voxwire serve`` went on to serve with (the server itself is not started)."""
    served: list[ServerConfig] = []

    def serve(config: ServerConfig) -> int:
        served.append(config)
        return 0

    monkeypatch.setattr("voxwire.serving.launch.serve", serve)
    return served


@pytest.mark.parametrize(
    ("flags", "environ"),
    [
        (["--host", "0.0.0.0"], {}),
        ([], {"VOXWIRE_HOST": "0.0.0.0"}),
        (["--host", "::"], {}),
        (["--host", "10.1.2.3"], {}),
        (["--host", "my-host.example"], {}),
    ],
)
def test_a_non_loopback_address_without_keys_is_refused(
    flags: list[str],
    environ: dict[str, str],
    started: list[ServerConfig],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert main(["serve", "--model", "sim", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("voxwire serve: error: ") and err.count("\n") == 1, err
    assert "needs an API key" in err and "--no-auth" in err
    assert started == []


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "127.0.0.2"])
def test_loopback_without_keys_starts_as_before(host: str, started: list[ServerConfig]) -> None:
    assert main(["serve", "--model", "sim", "--host", host]) == 0
    assert [config.transport.host for config in started] == [host]


def test_keys_let_it_listen_on_every_interface(started: list[ServerConfig], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VOXWIRE_API_KEYS", "k1")
    assert main(["serve", "--model", "sim", "--host", "0.0.0.0"]) == 0
    assert started[0].transport.api_keys == ("k1",)


@pytest.mark.parametrize("opt_out", [["--no-auth"], []])
def test_no_auth_serves_openly_with_a_warning(
    opt_out: list[str], started: list[ServerConfig], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    if not opt_out:
        monkeypatch.setenv("VOXWIRE_NO_AUTH", "true")
    with caplog.at_level(logging.WARNING):
        assert main(["serve", "--model", "sim", "--host", "0.0.0.0", *opt_out]) == 0
    assert started[0].transport.api_keys == ()
    (warning,) = [record for record in caplog.records if record.levelno == logging.WARNING]
    assert "authentication is off" in warning.getMessage() and "0.0.0.0" in warning.getMessage()


def test_no_auth_with_keys_is_a_contradiction(started: list[ServerConfig], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--model", "sim", "--no-auth", "--api-key", "k1"]) == 2
    assert "--no-auth" in capsys.readouterr().err
    assert started == []
