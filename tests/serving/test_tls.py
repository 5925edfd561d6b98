"""TLS in the server (issue 32 item 6): ``--tls-cert``/``--tls-key`` serve HTTPS and WSS on the one port, verified
against the certificate; a renewed pair is served to new connections without a restart (on a file change and on
SIGHUP), and a bad one is refused while the old keeps serving. Certificates are made here with ``openssl req``."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import ssl
import subprocess
import urllib.request
from pathlib import Path

import aiohttp
import pytest
from tests.server_process import ServerProcess, poll

from voxwire.cli.main import main

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")


def make_pair(folder: Path, name: str) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 with common name ``name``, and its key."""
    folder.mkdir(parents=True, exist_ok=True)
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={name}",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


def trusting(cert: Path) -> ssl.SSLContext:
    """A client context that verifies the server against ``cert`` only."""
    return ssl.create_default_context(cafile=str(cert))


def served_certificate(url: str) -> bytes:
    """The DER certificate a new TLS connection to ``url``'s host and port is given (not verified)."""
    host, port = url.removeprefix("https://").rsplit(":", 1)
    return ssl.get_server_certificate((host, int(port))).encode()


def ready_over(url: str, context: ssl.SSLContext) -> bool:
    try:
        with urllib.request.urlopen(url + "/ready", context=context, timeout=10) as response:
            return bool(response.status == 200)
    except OSError:  # 503 while warming up (HTTPError is an OSError)
        return False


def same_certificate(served: bytes, cert: Path) -> bool:
    return ssl.PEM_cert_to_DER_cert(served.decode()) == ssl.PEM_cert_to_DER_cert(cert.read_text())


def replace_pair(live: tuple[Path, Path], new: tuple[Path, Path]) -> None:
    """Install ``new`` over the live files, as a renewal does (key first, then the certificate)."""
    shutil.copyfile(new[1], live[1])
    shutil.copyfile(new[0], live[0])


@pytest.fixture
def pairs(tmp_path: Path) -> tuple[tuple[Path, Path], tuple[Path, Path], tuple[Path, Path]]:
    """The live pair the server is given, the first certificate's copy and a renewed one."""
    first, renewed = make_pair(tmp_path / "first", "first"), make_pair(tmp_path / "renewed", "renewed")
    live = (tmp_path / "live" / "cert.pem", tmp_path / "live" / "key.pem")
    live[0].parent.mkdir()
    replace_pair(live, first)
    return live, first, renewed


async def speak_elevenlabs(url: str, context: ssl.SSLContext) -> tuple[int, bool]:
    """Bytes of audio and whether the turn ended ``isFinal`` on the ElevenLabs socket at ``wss://``."""
    wss = url.replace("https://", "wss://") + "/v1/text-to-speech/default/stream-input?output_format=pcm_16000"
    audio, final = 0, False
    async with aiohttp.ClientSession() as session, session.ws_connect(wss, ssl=context) as ws:
        await ws.send_json({"text": " "})
        await ws.send_json({"text": "Hello over TLS."})
        await ws.send_json({"text": ""})
        while not final:
            message = json.loads((await asyncio.wait_for(ws.receive(), 30)).data)
            audio += len(message.get("audio") or "")
            final = message.get("isFinal") is True
    return audio, final


@pytest.mark.slow
def test_https_and_wss_on_one_port_and_a_renewed_pair_without_a_restart(
    pairs: tuple[tuple[Path, Path], tuple[Path, Path], tuple[Path, Path]], monkeypatch: pytest.MonkeyPatch
) -> None:
    from elevenlabs.client import ElevenLabs

    live, first, renewed = pairs
    tls = ("--tls-cert", str(live[0]), "--tls-key", str(live[1]), "--tls-poll-s", "0.2")
    with ServerProcess("--model", "sim", *tls) as server:
        assert server.url.startswith("https://")
        context = trusting(first[0])
        with urllib.request.urlopen(server.url + "/health", context=context, timeout=10) as response:
            assert response.status == 200
        assert poll(lambda: ready_over(server.url, context), timeout=60), server.log
        audio, final = asyncio.run(speak_elevenlabs(server.url, context))
        assert final and audio > 0
        # ElevenLabs' own SDK, which forces wss:// for its realtime call, trusting the certificate as a user would.
        monkeypatch.setenv("SSL_CERT_FILE", str(first[0]))
        sdk = ElevenLabs(api_key="unused", base_url=server.url)
        spoken = b"".join(
            sdk.text_to_speech.convert_realtime("default", text=iter(["Hi there."]), output_format="pcm_16000")
        )
        assert len(spoken) > 0
        with pytest.raises(OSError):  # plain HTTP on the TLS port gets nothing it can read
            urllib.request.urlopen(server.url.replace("https://", "http://") + "/health", timeout=10)

        replace_pair(live, renewed)  # the files change: the next poll loads them
        assert poll(lambda: same_certificate(served_certificate(server.url), renewed[0]), timeout=30)
        with urllib.request.urlopen(server.url + "/ready", context=trusting(renewed[0]), timeout=10) as response:
            assert response.status == 200

        live[1].write_text("not a key\n")  # a renewal half-written: refused, the renewed pair keeps serving
        assert poll(lambda: "new pair is refused" in server.log, timeout=30), server.log
        assert same_certificate(served_certificate(server.url), renewed[0])

        replace_pair(live, first)
        server.process.send_signal(signal.SIGHUP)  # SIGHUP reloads at once (and a poll would, too)
        assert poll(lambda: same_certificate(served_certificate(server.url), first[0]), timeout=30)
        # Nothing is live: the drain ends at once (the ElevenLabs sockets' handlers ended with their sockets; one
        # that did not held the stop for aiohttp's 60 s shutdown timeout).
        assert server.stop(timeout=30) == 0, server.log


def test_tls_needs_both_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cert, _ = make_pair(tmp_path, "one")
    assert main(["serve", "--model", "sim", "--workers", "0", "--tls-cert", str(cert)]) == 2
    assert "--tls-cert and --tls-key" in capsys.readouterr().err


def test_an_unreadable_tls_file_is_a_clear_start_up_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cert, key = make_pair(tmp_path, "one")
    missing = tmp_path / "nowhere.pem"
    assert main(["serve", "--model", "sim", "--workers", "0", "--tls-cert", str(cert), "--tls-key", str(missing)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("voxwire serve: error: cannot read the TLS file") and str(missing) in err
    assert main(["serve", "--model", "sim", "--workers", "0", "--tls-cert", str(key), "--tls-key", str(key)]) == 2
    assert "not a PEM certificate chain and its private key" in capsys.readouterr().err


@pytest.mark.slow
def test_with_workers_each_frontend_serves_tls_and_sighup_reloads_it(
    pairs: tuple[tuple[Path, Path], tuple[Path, Path], tuple[Path, Path]],
) -> None:
    live, first, renewed = pairs
    tls = ("--tls-cert", str(live[0]), "--tls-key", str(live[1]), "--tls-poll-s", "3600")  # SIGHUP only
    with ServerProcess("--model", "sim", "--workers", "2", *tls) as server:
        assert server.url.startswith("https://")
        assert poll(lambda: ready_over(server.url, trusting(first[0])), timeout=120), server.log
        replace_pair(live, renewed)
        server.process.send_signal(signal.SIGHUP)  # to the supervisor, which tells the frontends
        # Every frontend reloaded: fresh connections (spread over both by the kernel) all get the renewed one.
        assert poll(lambda: all(same_certificate(served_certificate(server.url), renewed[0]) for _ in range(8)), 30)
        assert server.process.poll() is None, "SIGHUP with TLS reloads, it does not stop the server"
