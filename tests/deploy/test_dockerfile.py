"""The image stays buildable: the torch it installs is within the server extra's bound, its CUDA base image is of
the CUDA release that torch was built for, and the package it installs, built from exactly the files its COPY lines
take (less what its .dockerignore leaves out), is the package built from the whole checkout."""

from __future__ import annotations

import re
import shlex
import shutil
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.version import Version
from tests.deploy.fleet import DEPLOY
from tests.deploy.shipped import dockerfile_instructions
from tests.venvs import ROOT, copy_sources, outside_env, run


def build_args() -> dict[str, str]:
    """The Dockerfile's ``ARG NAME=default``s."""
    pairs = [value.split("=", 1) for keyword, value in dockerfile_instructions() if keyword == "ARG" and "=" in value]
    return {name: default for name, default in pairs}


def server_torch() -> Requirement:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    [torch] = [Requirement(line) for line in extras["server"] if Requirement(line).name == "torch"]
    return torch


def test_the_image_installs_a_supported_torch_built_for_its_cuda_image() -> None:
    args = build_args()
    torch = server_torch()
    assert Version(args["TORCH_VERSION"]) in torch.specifier, (args["TORCH_VERSION"], str(torch))
    [index_cuda] = re.findall(r"^https://download\.pytorch\.org/whl/cu(\d+)$", args["TORCH_INDEX"])
    [(major, minor)] = re.findall(r"^nvidia/cuda:(\d+)\.(\d+)\.\d+-\S*runtime-ubuntu[\d.]+$", args["CUDA_IMAGE"])
    assert index_cuda == major + minor, "torch's CUDA build and the base image's CUDA release differ"


def docker_copies(destination: Path) -> Path:
    """What the Dockerfile's COPY lines put in its build folder, from this checkout, as Docker copies it: a folder's
    contents into the target, files into a target ending in ``/``, nothing its .dockerignore leaves out of the
    context."""
    for keyword, value in dockerfile_instructions():
        if keyword != "COPY":
            continue
        *sources, target = shlex.split(value)
        into = destination / target
        for source in sources:
            matches = sorted(ROOT.glob(source))
            assert matches, f"COPY {source}: no such file in the checkout"
            for path in matches:
                files = sorted(file for file in path.rglob("*") if file.is_file()) if path.is_dir() else [path]
                sent = [file for file in files if not docker_ignores(file.relative_to(ROOT).as_posix())]
                assert sent, f"COPY {source}: {path.relative_to(ROOT)} is left out of the context by the .dockerignore"
                for file in sent:
                    if path.is_dir():
                        copied = into / file.relative_to(path)
                    else:
                        copied = into / file.name if target.endswith("/") else into
                    copied.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(file, copied)
    return destination


def docker_ignores(path: str) -> bool:
    """Whether the .dockerignore leaves ``path`` (relative to the context) out: the last pattern matching it or a
    folder above it decides, ``!`` letting it in (``*`` stays within a folder, ``**/`` spans any)."""
    lines = (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
    parts = path.split("/")
    prefixes = ["/".join(parts[:end]) for end in range(1, len(parts) + 1)]
    ignored = False
    for line in (line.strip() for line in lines):
        if not line or line.startswith("#"):
            continue
        body = line.removeprefix("!").rstrip("/")
        pattern = re.escape(body).replace(r"\*\*/", "(.*/)?").replace(r"\*", "[^/]*").replace(r"\?", "[^/]")
        if any(re.fullmatch(pattern, prefix) for prefix in prefixes):
            ignored = not line.startswith("!")
    return ignored


def wheel_names(source: Path, out: Path) -> set[str]:
    """The files of the wheel built from ``source`` (no isolation: setuptools comes from this interpreter)."""
    run(sys.executable, "-m", "build", "--wheel", "--no-isolation", "--skip-dependency-check", "--outdir", out,
        source, cwd=source.parent, env=outside_env())  # fmt: skip
    [wheel] = out.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        return set(archive.namelist())


@pytest.mark.slow
def test_the_image_builds_the_package_the_checkout_builds(tmp_path: Path) -> None:
    image = wheel_names(docker_copies(tmp_path / "image" / "src"), tmp_path / "image" / "dist")
    checkout = wheel_names(copy_sources(tmp_path / "checkout" / "src"), tmp_path / "checkout" / "dist")
    assert "voxwire/web/index.html" in image  # the demo page the server serves at /
    assert image == checkout, f"only in the checkout's wheel: {sorted(checkout - image)}"
