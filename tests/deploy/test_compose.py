"""``scripts/deploy/compose.yaml``, one host with one GPU: read as Docker Compose reads it (``docker compose config``
is not installed here), the settings the server would run with are parsed by its own CLI, and its health check
command runs against a live server (yamllint checks the file with the other manifests: test_manifests)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.deploy.fleet import DEPLOY, ROOT
from tests.deploy.shipped import dockerfile_instructions, image_environment, serve_variables
from tests.server_process import ServerProcess, poll

from voxwire.cli import environment
from voxwire.cli.main import build_parser
from voxwire.cli.serve import config_from_args
from voxwire.serving.server_config import ServerConfig

COMPOSE = DEPLOY / "compose.yaml"
HOST_ENV = {"VOXWIRE_API_KEYS": "k1,k2"}
"""What the operator exports before ``docker compose up`` (the file requires the keys)."""
_VARIABLE = re.compile(r"\$\{(\w+)(?::([-?])([^}]*))?\}")


def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return loaded


def service() -> dict[str, Any]:
    (name,) = compose()["services"]
    assert name == "voxwire"
    found: dict[str, Any] = compose()["services"][name]
    return found


def interpolate(value: str, host: dict[str, str]) -> str:
    """Compose's ``${NAME}``, ``${NAME:-default}`` and ``${NAME:?error}`` with the host's variables ``host``."""

    def substitute(found: re.Match[str]) -> str:
        name, kind, word = found.groups()
        if host.get(name):
            return host[name]
        if kind == "?":
            raise LookupError(f"{name}: {word}")
        return word if kind == "-" else ""

    return _VARIABLE.sub(substitute, value)


def container_environment(host: dict[str, str]) -> dict[str, str]:
    """The container's variables: the image's, then the service's ``environment`` (interpolated)."""
    environ = image_environment()
    environ.update({name: interpolate(str(value), host) for name, value in service()["environment"].items()})
    return environ


def container_config(host: dict[str, str]) -> ServerConfig:
    """The settings the container serves with: the image's entrypoint (and the service's command, if any), parsed
    by the server's own CLI with the container's variables."""
    instructions = dict(dockerfile_instructions())
    entrypoint = yaml.safe_load(instructions["ENTRYPOINT"])
    assert entrypoint[:2] == ["voxwire", "serve"] and "entrypoint" not in service()
    args = build_parser().parse_args([*entrypoint[1:], *service().get("command", [])])
    return config_from_args(args, environ=container_environment(host))


def mounts() -> dict[str, Path]:
    """Named volume -> its path in the container; every one is declared at the top level."""
    found = {}
    for mount in service()["volumes"]:
        name, path = mount.split(":")[:2]
        assert name in compose()["volumes"], f"volume {name} is not declared"
        found[name] = Path(path)
    return found


def seconds(duration: str) -> float:
    value, unit = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h)", duration).groups()  # type: ignore[union-attr]
    return float(value) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[unit]


def test_it_builds_the_shipped_image_from_the_repository() -> None:
    build = service()["build"]
    context = (COMPOSE.parent / build["context"]).resolve()
    assert context == ROOT
    assert (context / build["dockerfile"]).resolve() == DEPLOY / "Dockerfile"


def test_it_reserves_one_nvidia_gpu() -> None:
    (device,) = service()["deploy"]["resources"]["reservations"]["devices"]
    assert (device["driver"], device["count"], device["capabilities"]) == ("nvidia", 1, ["gpu"])


def test_it_is_configured_through_voxwire_variables_the_server_reads() -> None:
    """Only ``VOXWIRE_*`` variables the server reads (a misspelt one would be ignored); the API keys must come from
    the host; together they give a server on the published port with its voices and model cache on volumes."""
    variables = service()["environment"]
    assert {name for name in variables if name.startswith(environment.PREFIX)} <= serve_variables()
    with pytest.raises(LookupError, match="VOXWIRE_API_KEYS"):
        container_config({})
    config = container_config(HOST_ENV)
    assert config.transport.api_keys == ("k1", "k2")
    assert config.engine.model == "openbmb/VoxCPM2"
    assert container_config({**HOST_ENV, "VOXWIRE_MODEL": "/models/my-checkpoint"}).engine.model.endswith("checkpoint")
    published = [mapping.split(":") for mapping in service()["ports"]]
    assert config.transport.host == "0.0.0.0" and [[str(config.transport.port)] * 2] == published
    volumes = mounts()
    assert config.voices.voices_dir is not None and config.voices.voices_dir.is_relative_to(volumes["voices"])
    assert Path(container_environment(HOST_ENV)["HF_HOME"]).is_relative_to(volumes["models"])


def test_the_image_creates_the_mounted_folders_for_its_user() -> None:
    """A fresh named volume takes the owner of the folder it is mounted on: the image must create it for uid
    10001, or the server could not write its voices or model cache."""
    (run,) = [value for keyword, value in dockerfile_instructions() if keyword == "RUN" and "useradd" in value]
    for path in mounts().values():
        assert re.search(rf"mkdir -p [^&]*{path}\b", run) and re.search(rf"chown voxwire:voxwire [^&]*{path}\b", run)


def test_docker_stops_it_only_after_the_drain() -> None:
    limits = container_config(HOST_ENV).limits
    assert seconds(service()["stop_grace_period"]) > limits.drain_timeout_s + limits.trace_flush_timeout_s
    assert service()["restart"] == "unless-stopped"


def health_check(server: ServerProcess, state: Path) -> bool:
    """Run the service's health check command, as Docker runs it in the container, against ``server``; ``state``:
    the container's temporary folder."""
    check = service()["healthcheck"]["test"]
    assert check[:3] == ["CMD", "python3", "-c"]
    port = server.url.rsplit(":", 1)[1]
    environ = {**os.environ, "VOXWIRE_PORT": port, "TMPDIR": str(state)}
    return (
        subprocess.run([sys.executable, "-c", check[3]], env=environ, capture_output=True, timeout=30).returncode == 0
    )


@pytest.mark.slow
def test_the_health_check_waits_for_ready_then_watches_health(tmp_path: Path) -> None:
    """Healthy once the server has been ready (``up --wait`` returns then), then as long as it is alive: a
    draining server, whose /ready is 503, stays healthy for a container that was ready, and is not healthy for one
    that never was."""
    started, fresh = tmp_path / "started", tmp_path / "fresh"
    started.mkdir()
    fresh.mkdir()
    timing = service()["healthcheck"]
    assert seconds(timing["start_period"]) >= 300 and seconds(timing["timeout"]) < seconds(timing["interval"])
    with ServerProcess("--model", "sim", "--sim-cost", "30ms", "--drain-timeout-s", "30") as server:
        server.wait_ready()
        assert health_check(server, started)
        # A stream its client does not read: the server waits on it, so the drain lasts.
        body = json.dumps(
            {"model": "tts-1", "voice": "alloy", "input": "Hold the drain. " * 200, "response_format": "pcm"}
        )
        request = urllib.request.Request(
            server.url + "/v1/audio/speech", body.encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            assert response.read(1024)
            server.process.send_signal(signal.SIGTERM)
            assert poll(lambda: server.status("/ready") == 503, timeout=10), server.log
            assert server.status("/health") == 200
            assert health_check(server, started)
            assert not health_check(server, fresh)
