"""``pip install voxwire`` (no extras) is the client side: no torch, and ``voxwire say`` and ``voxwire bench`` work
from it against a server, which runs from this checkout's environment.

The install is a fresh virtual environment (no system site-packages) filled from the package index, as on an agent
host; ``voxwire serve`` there exits 2 naming the ``server`` extra. The framework extras (Pipecat, LiveKit) resolve
without torch, and their services import without any of the server's modules.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import soundfile
from tests.server_process import ServerProcess
from tests.venvs import copy_sources, outside_env, run

from voxwire.cli.main import SERVER_EXTRA_MODULES

TEXT = "A client without torch speaks through the server."
CLIENT_MODULES = (
    "voxwire", "voxwire.audio", "voxwire.audio.pcm", "voxwire.audio.resample", "voxwire.audio.backend",
    "voxwire.audio.ogg", "voxwire.errors", "voxwire.serving", "voxwire.protocol", "voxwire.protocol.wire",
    "voxwire.protocol.error_codes",
)  # fmt: skip
"""The modules outside client/ and integrations/ that clients may import: none loads the model or serves."""


@pytest.fixture(scope="module")
def client_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with ``pip install <checkout copy>``, no extras; its bin folder."""
    folder = tmp_path_factory.mktemp("client-install")
    source = copy_sources(folder / "source")
    env = outside_env()
    run(sys.executable, "-m", "venv", folder / "venv", cwd=folder, env=env)
    bin_dir = folder / "venv" / "bin"
    run(bin_dir / "python", "-m", "pip", "install", "-q", source, cwd=folder, env=env)
    return bin_dir


@pytest.mark.slow
def test_the_base_install_has_no_server_dependency(client_venv: Path) -> None:
    env = outside_env()
    assert subprocess.run([client_venv / "pip", "show", "torch"], env=env, capture_output=True).returncode != 0
    assert subprocess.run([client_venv / "python", "-c", "import torch"], env=env, capture_output=True).returncode
    code = f"import importlib.util; print([m for m in {SERVER_EXTRA_MODULES!r} if importlib.util.find_spec(m)])"
    assert run(client_venv / "python", "-c", code, cwd=client_venv, env=env).strip() == "[]"
    where = run(client_venv / "python", "-c", "import voxwire; print(voxwire.__file__)", cwd=client_venv, env=env)
    assert Path(where.strip()).is_relative_to(client_venv.parent), where

    serve = subprocess.run([client_venv / "voxwire", "serve"], env=env, capture_output=True, text=True)
    assert serve.returncode == 2 and serve.stdout == ""
    assert serve.stderr.count("\n") == 1 and "pip install 'voxwire[server]'" in serve.stderr, serve.stderr


@pytest.mark.slow
def test_say_and_bench_from_the_base_install_against_a_server(client_venv: Path, tmp_path: Path) -> None:
    env = outside_env()
    with ServerProcess("--model", "sim", "--sim-cost", "5ms+0.1ms/row") as server:
        server.wait_ready()
        wav, opus, report = tmp_path / "speech.wav", tmp_path / "speech.opus", tmp_path / "bench.json"
        run(client_venv / "voxwire", "say", "--server", server.ws_url, "--seed", "3", "--out", wav, TEXT,
            cwd=tmp_path, env=env)  # fmt: skip
        run(client_venv / "voxwire", "say", "--server", server.ws_url, "--seed", "3", "--out", opus, TEXT,
            cwd=tmp_path, env=env)  # fmt: skip
        printed = run(client_venv / "voxwire", "bench", "--server", server.ws_url, "--concurrency", "2",
                      "--duration", "3", "--quiet", "--json", report, cwd=tmp_path, env=env)  # fmt: skip
        assert server.stop() == 0, server.log
    audio, rate = soundfile.read(wav, dtype="float32")
    assert rate == 48000 and audio.size > rate and abs(audio).max() > 0.05  # seconds of the sim model's speech
    # Ogg Opus is the server's bytes, forwarded: the client needs no Opus library.
    run("opusinfo", opus, cwd=tmp_path, env=env)
    [level] = json.loads(report.read_text())["levels"]
    assert level["failed"] == 0 and len(level["records"]) >= 2
    assert "c=2" in printed


@pytest.mark.slow
def test_the_framework_extras_resolve_without_torch(client_venv: Path, tmp_path: Path) -> None:
    source = client_venv.parents[1] / "source"
    report = tmp_path / "resolution.json"
    run(client_venv / "python", "-m", "pip", "install", "-q", "--dry-run", "--ignore-installed", "--report", report,
        f"{source}[pipecat,livekit]", cwd=tmp_path, env=outside_env())  # fmt: skip
    resolved = {item["metadata"]["name"].lower() for item in json.loads(report.read_text())["install"]}
    assert {"pipecat-ai", "livekit-agents", "voxwire"} <= resolved
    assert "torch" not in resolved


@pytest.mark.slow
@pytest.mark.parametrize("service", ["voxwire.integrations.pipecat", "voxwire.integrations.livekit"])
def test_the_framework_services_import_without_the_server(service: str) -> None:
    code = f"import json, sys, {service}\nprint(json.dumps(sorted(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    modules = json.loads(result.stdout.splitlines()[-1])
    assert "torch" not in modules
    server_side = [
        name
        for name in modules
        if name.startswith("voxwire")
        and not name.startswith(("voxwire.client", "voxwire.integrations"))
        and name not in CLIENT_MODULES
    ]
    assert server_side == [], f"{service} imports server modules"
