"""The shipped deployment files: valid YAML and kustomizations, probes that point at what the server serves and
mean what Kubernetes needs, a grace period that outlasts the drain, balancer configurations their own binaries
accept, and a non-root CUDA image that runs ``voxwire serve``."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp.test_utils import TestClient
from tests.deploy.fleet import DEPLOY, has_binary, load_render
from tests.deploy.shipped import dockerfile_instructions, image_environment, serve_variables

from voxwire.cli import environment
from voxwire.cli.main import build_parser
from voxwire.cli.serve import config_from_args
from voxwire.errors import InvalidInputError
from voxwire.serving.runtime.keys import STATE_KEY, Phase
from voxwire.serving.server_config import ServerConfig

K8S = DEPLOY / "k8s"
ROOT = DEPLOY.parents[1]
DOCS = ROOT / "docs"
KEY_DEPLOYMENT = ("Deployment", "voxwire")
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


# What Kubernetes puts in a pod's variables that come from elsewhere (valueFrom), by the kind of source.
POD_NAME, SECRET = "voxwire-6d9c8b7f4-x2k9q", "key-from-the-secret"
VALUE_FROM = {"fieldRef": POD_NAME, "secretKeyRef": SECRET}


def env_file(path: Path) -> dict[str, str]:
    lines = [line for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]
    return dict(line.split("=", 1) for line in lines)


def pod_environment() -> dict[str, str]:
    """A pod's variables: the image's, then the ConfigMaps its envFrom names (built from their generators' env
    files), then its own env (later ones win, as in Kubernetes)."""
    kustomization = yaml.safe_load((K8S / "base" / "kustomization.yaml").read_text())
    generators = {generator["name"]: generator for generator in kustomization["configMapGenerator"]}
    environ = image_environment()
    container = voxwire_container()
    for source in container.get("envFrom", []):
        for path in generators[source["configMapRef"]["name"]].get("envs", []):
            environ.update(env_file(K8S / "base" / path))
    for variable in container.get("env", []):
        value_from = variable.get("valueFrom", {})
        environ[variable["name"]] = variable["value"] if "value" in variable else VALUE_FROM[next(iter(value_from))]
    return environ


def pod_config(environ: dict[str, str] | None = None) -> ServerConfig:
    """The settings a pod serves with: the image's entrypoint and the pod's args, parsed by the server's own CLI
    with the pod's variables (or ``environ``)."""
    instructions = dict(dockerfile_instructions())
    command = [*yaml.safe_load(instructions["ENTRYPOINT"]), *yaml.safe_load(instructions.get("CMD", "[]"))]
    assert command[:2] == ["voxwire", "serve"]
    args = build_parser().parse_args([*command[1:], *voxwire_container().get("args", [])])
    return config_from_args(args, environ=pod_environment() if environ is None else environ)


def test_yaml_passes_yamllint() -> None:
    if shutil.which("yamllint") is None:
        pytest.skip("yamllint is not installed (apt-get install yamllint)")
    result = subprocess.run(
        ["yamllint", "-s", "-c", str(DEPLOY / ".yamllint"), str(DEPLOY)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def kustomize(folder: Path) -> list[dict[str, Any]]:
    """``kubectl kustomize folder``: the manifests it renders."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        # CI installs it (.ci/run) and sets VOXWIRE_REQUIRE_KUBECTL=1: there a missing kubectl is a failure.
        message = "kubectl is not installed (apt-get install kubectl): `kubectl kustomize` cannot be checked here"
        if os.environ.get("VOXWIRE_REQUIRE_KUBECTL") == "1":
            pytest.fail(message)
        pytest.skip(message)
    result = subprocess.run([kubectl, "kustomize", str(folder)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_kustomizations_build(overlay: str) -> None:
    kinds = {(doc["kind"], doc["metadata"]["name"]) for doc in kustomize(K8S / overlay)}
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


def shell_blocks(page: Path) -> list[str]:
    return re.findall(r"^```(?:bash|sh)\n(.*?)^```", page.read_text(encoding="utf-8"), flags=re.MULTILINE | re.DOTALL)


def test_the_documented_overlay_runs_the_image_it_pushes(tmp_path: Path) -> None:
    """docs/deploy's Kubernetes commands: the overlay they write points the pods at the image they pushed."""
    (block,) = [block for block in shell_blocks(DOCS / "deploy.md") if "kubectl apply -k" in block]
    (pushed,) = re.findall(r"^docker push (\S+)$", block, flags=re.MULTILINE)
    (folder, overlay), *_ = re.findall(r"cat > (\S+)/kustomization.yaml <<'EOF'\n(.*?)^EOF$", block, re.M | re.S)
    written = tmp_path / folder
    written.mkdir()
    # The commands run from the repository root; the overlay's relative path to the base, from here instead.
    base = os.path.relpath(K8S / "base", written)
    (written / "kustomization.yaml").write_text(overlay.replace("../scripts/deploy/k8s/base", base))
    (deployment,) = [doc for doc in kustomize(written) if (doc["kind"], doc["metadata"]["name"]) == KEY_DEPLOYMENT]
    (container,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "voxwire"]
    assert container["image"] == pushed


@pytest.mark.parametrize("page", [ROOT / "README.md", *sorted(DOCS.glob("*.md"))], ids=lambda path: path.name)
def test_pages_create_the_namespace_before_the_secret_in_it(page: Path) -> None:
    for block in shell_blocks(page):
        lines = block.splitlines()
        for number, line in enumerate(lines):
            if "create secret" in line:
                before = "\n".join(lines[:number])
                assert "namespace.yaml" in before or "create namespace" in before, f"{page.name}: {line}"


def test_the_whole_nginx_example_passes_nginx_t(tmp_path: Path) -> None:
    """scripts/deploy/nginx-main.conf with the rendered include, as docs/deploy installs them (paths moved here)."""
    if not has_binary("nginx"):
        pytest.skip("nginx is not installed (apt-get install nginx)")
    include = tmp_path / "voxwire.conf"
    include.write_text(render.render("nginx", "127.0.0.1:18080", render.Upstreams(("127.0.0.1:9001",))))
    main = (DEPLOY / "nginx-main.conf").read_text()
    assert "include /etc/nginx/conf.d/voxwire.conf;" in main
    main = main.replace("/etc/nginx/conf.d/voxwire.conf", str(include)).replace("/var/log/nginx/", f"{tmp_path}/")
    (tmp_path / "nginx.conf").write_text(main)
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    command = [nginx, "-t", "-e", "stderr", "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf")]
    result = subprocess.run([*command, "-g", f"pid {tmp_path / 'nginx.pid'};"], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


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


def test_the_grace_period_outlasts_the_pre_stop_pause_the_drain_and_the_span_flush() -> None:
    spec = voxwire_deployment()["spec"]["template"]["spec"]
    command = voxwire_container()["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    pause = float(command[1])
    limits = pod_config().limits
    assert spec["terminationGracePeriodSeconds"] > pause + limits.drain_timeout_s + limits.trace_flush_timeout_s


def test_pods_are_configured_through_voxwire_variables() -> None:
    """No argument list: the image and the manifests set ``VOXWIRE_*`` variables, each one the server reads
    (a misspelt one would be ignored), and together they give the settings the manifests rely on."""
    container, environ = voxwire_container(), pod_environment()
    assert "args" not in container
    assert {name for name in environ if name.startswith(environment.PREFIX)} <= serve_variables()
    config = pod_config()
    exposed = [int(value) for keyword, value in dockerfile_instructions() if keyword == "EXPOSE"]
    assert (config.transport.host, [config.transport.port]) == ("0.0.0.0", exposed)
    assert config.transport.port in [port["containerPort"] for port in container["ports"]]
    assert config.engine.model == "openbmb/VoxCPM2"
    assert (config.transport.replica_id, config.transport.api_keys) == (POD_NAME, (SECRET,))
    mounts = [Path(mount["mountPath"]) for mount in container["volumeMounts"]]
    assert config.voices.voices_dir is not None and any(
        config.voices.voices_dir.is_relative_to(mount) for mount in mounts
    )


def test_a_pod_without_its_api_keys_does_not_start() -> None:
    """Never an open server by accident (security probe 4, F7): the Secret is required, so the kubelet holds a pod
    whose Secret is missing (``CreateContainerConfigError``), and the server refuses to start on the image's
    0.0.0.0 with the key list unset (a missing Secret key) or empty (an empty one)."""
    (keys,) = [variable for variable in voxwire_container()["env"] if variable["name"] == "VOXWIRE_API_KEYS"]
    assert keys["valueFrom"]["secretKeyRef"].get("optional", False) is False
    without_keys = {name: value for name, value in pod_environment().items() if name != "VOXWIRE_API_KEYS"}
    with pytest.raises(ValueError, match="needs an API key"):
        pod_config(without_keys)
    with pytest.raises(InvalidInputError, match="VOXWIRE_API_KEYS: set but lists no value"):
        pod_config({**without_keys, "VOXWIRE_API_KEYS": ""})


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
    instructions = dockerfile_instructions()
    keywords = [keyword for keyword, _ in instructions]
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
