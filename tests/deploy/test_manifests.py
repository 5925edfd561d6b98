"""The shipped deployment files: valid YAML and kustomizations, probes that point at what the server serves and
mean what Kubernetes needs, a grace period that outlasts the drain, balancer configurations their own binaries
accept, and a non-root CUDA image that runs ``voxwire serve``."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp.test_utils import TestClient
from tests.deploy.fleet import DEPLOY, has_binary, load_render

from voxwire.serving.keys import STATE_KEY, Phase

K8S = DEPLOY / "k8s"
OVERLAYS = ("base", "keda")
render = load_render()


def documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def voxwire_deployment() -> dict[str, Any]:
    (deployment,) = [doc for doc in documents(K8S / "base" / "deployment.yaml") if doc["kind"] == "Deployment"]
    return deployment


def voxwire_container() -> dict[str, Any]:
    (container,) = voxwire_deployment()["spec"]["template"]["spec"]["containers"]
    return container


def test_yaml_passes_yamllint() -> None:
    if shutil.which("yamllint") is None:
        pytest.skip("yamllint is not installed (apt-get install yamllint)")
    result = subprocess.run(
        ["yamllint", "-s", "-c", str(DEPLOY / ".yamllint"), str(DEPLOY)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_kustomizations_build(overlay: str) -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed (not packaged by Debian): `kubectl kustomize` cannot be checked here")
    result = subprocess.run([kubectl, "kustomize", str(K8S / overlay)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    kinds = {(doc["kind"], doc["metadata"]["name"]) for doc in yaml.safe_load_all(result.stdout)}
    expected = {
        ("Deployment", "voxwire"),
        ("Service", "voxwire"),
        ("Service", "voxwire-headless"),
        ("PodDisruptionBudget", "voxwire"),
        ("Deployment", "voxwire-haproxy"),
    }
    if overlay == "keda":
        expected.add(("ScaledObject", "voxwire"))
    assert expected <= kinds


def test_probes_use_ready_for_traffic_and_health_for_liveness() -> None:
    container = voxwire_container()
    probes = ("startupProbe", "readinessProbe", "livenessProbe")
    paths = {probe: container[probe]["httpGet"]["path"] for probe in probes}
    assert paths == {"startupProbe": "/ready", "readinessProbe": "/ready", "livenessProbe": "/health"}
    port = container["startupProbe"]["httpGet"]["port"]
    assert port in [p["name"] for p in container["ports"]]


@pytest.mark.asyncio
async def test_the_probe_paths_answer_as_kubernetes_needs(serve, aiohttp_client) -> None:
    """/ready turns 503 while draining (the pod leaves the Service), /health stays 200 (the drain is not killed)."""
    client: TestClient = await aiohttp_client(await serve())
    container = voxwire_container()
    ready, live = container["readinessProbe"]["httpGet"]["path"], container["livenessProbe"]["httpGet"]["path"]
    assert (await client.get(ready)).status == 200
    assert (await client.get(live)).status == 200
    client.server.app[STATE_KEY].phase = Phase.DRAINING
    assert (await client.get(ready)).status == 503
    assert (await client.get(live)).status == 200
    client.server.app[STATE_KEY].phase = Phase.READY


def test_the_grace_period_outlasts_the_pre_stop_pause_and_the_drain() -> None:
    spec = voxwire_deployment()["spec"]["template"]["spec"]
    container = voxwire_container()
    (drain,) = [float(arg.split("=", 1)[1]) for arg in container["args"] if arg.startswith("--drain-timeout-s=")]
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    pause = float(command[1])
    assert spec["terminationGracePeriodSeconds"] > pause + drain


def test_each_pod_has_one_gpu_and_runs_as_non_root() -> None:
    spec = voxwire_deployment()["spec"]["template"]["spec"]
    assert voxwire_container()["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] != 0


def test_the_kubernetes_haproxy_config_is_the_rendered_template() -> None:
    upstreams = render.Upstreams(dns="voxwire-headless.voxwire.svc.cluster.local:8000")
    assert (K8S / "base" / "haproxy.cfg").read_text() == render.render("haproxy", ":8080", upstreams)


@pytest.mark.parametrize("upstreams", [("127.0.0.1:9001", "127.0.0.1:9002"), None])
def test_rendered_haproxy_configs_are_valid(tmp_path: Path, upstreams: tuple[str, ...] | None) -> None:
    if not has_binary("haproxy"):
        pytest.skip("haproxy is not installed (apt-get install haproxy)")
    dns = None if upstreams else "voxwire-headless.voxwire.svc.cluster.local:8000"
    config = tmp_path / "haproxy.cfg"
    config.write_text(render.render("haproxy", "127.0.0.1:18080", render.Upstreams(upstreams or (), dns)))
    haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
    result = subprocess.run([haproxy, "-c", "-f", str(config)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stdout + result.stderr


def test_rendering_refuses_what_it_cannot_express() -> None:
    with pytest.raises(ValueError, match="host:port"):
        render.Upstreams(("no-port",))
    with pytest.raises(ValueError, match="either"):
        render.Upstreams()
    with pytest.raises(ValueError, match="nginx resolves"):
        render.render("nginx", "8080", render.Upstreams(dns="voxwire-headless:8000"))
    with pytest.raises(ValueError, match="listen"):
        render.render("haproxy", "8080; evil", render.Upstreams(("127.0.0.1:1",)))


def test_the_dockerfile_builds_a_non_root_cuda_image_running_voxwire_serve() -> None:
    """hadolint is not packaged by Debian; its checks that matter here are asserted directly (build it with the
    command at the top of the Dockerfile)."""
    text = (DEPLOY / "Dockerfile").read_text()
    instructions = [line.split(None, 1) for line in _logical_lines(text) if not line.startswith("#")]
    keywords = [keyword.upper() for keyword, _ in instructions]
    assert re.search(r"ARG CUDA_IMAGE=nvidia/cuda:\S+-runtime", text)
    assert dict(instructions)["FROM"] == "${CUDA_IMAGE}"
    users = [value for keyword, value in instructions if keyword == "USER"]
    assert users and users[-1].split(":")[0] not in ("0", "root")
    assert keywords.index("USER") < keywords.index("ENTRYPOINT")
    assert dict(instructions)["ENTRYPOINT"].startswith('["voxwire", "serve"')
    assert "docker build -f scripts/deploy/Dockerfile" in text
    if shutil.which("hadolint"):
        result = subprocess.run(["hadolint", str(DEPLOY / "Dockerfile")], capture_output=True, text=True)
        assert result.returncode == 0, result.stdout


def _logical_lines(text: str) -> list[str]:
    """Dockerfile lines with their backslash continuations joined."""
    return [line.strip() for line in re.sub(r"\\\n", " ", text).splitlines() if line.strip()]
