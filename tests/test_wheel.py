"""The distributions a release publishes: the sdist and the wheel built from it (``python -m build``, as the release
workflow builds them) pass ``twine check``, and the wheel works on its own: installed in a fresh virtual environment,
``voxwire serve`` serves the demo page and its modules (copied from client_js/ by setup.py's build step) and the API
page ``/docs``. With ``VOXWIRE_DIST`` set to a folder holding an sdist and a wheel (the release workflow's), those
are tested instead of building here."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

import pytest
from tests.script_modules import load_script
from tests.venvs import ROOT, copy_sources, outside_env, run, venv_seeing_these_packages

START_TIMEOUT_S = 180.0
WEB_FILES = ("index.html", "demo.js", "demo.css", "client.js", "player.js", "protocol.js", "worklet_source.js")
"""The demo page and the modules it loads: the wheel serves them, so the sdist carries them."""

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with the sdist and the wheel: ``VOXWIRE_DIST``, or built here from a copy of the sources."""
    given = os.environ.get("VOXWIRE_DIST")
    if given:
        return Path(given)
    folder = tmp_path_factory.mktemp("dist")
    source = copy_sources(folder / "source")
    # No isolation: setuptools comes from this interpreter, so nothing is downloaded.
    run(sys.executable, "-m", "build", "--no-isolation", "--skip-dependency-check", "--outdir", folder / "dist",
        source, cwd=folder, env=outside_env())  # fmt: skip
    return folder / "dist"


def test_the_sdist_and_the_wheel_pass_twine_check_and_carry_the_version_and_the_page(dist: Path) -> None:
    (sdist,) = dist.glob("voxwire-*.tar.gz")
    (wheel,) = dist.glob("voxwire-*.whl")
    run(sys.executable, "-m", "twine", "check", "--strict", sdist, wheel, cwd=dist, env=outside_env())
    version = load_script(ROOT / "scripts" / "release.py", "voxwire_release").source_version(ROOT)
    assert wheel.name.startswith(f"voxwire-{version}-") and sdist.name == f"voxwire-{version}.tar.gz"
    with zipfile.ZipFile(wheel) as archive:
        assert {f"voxwire/web/{name}" for name in WEB_FILES} <= set(archive.namelist())
    with tarfile.open(sdist) as archive:
        assert {f"voxwire-{version}/client_js/{name}" for name in WEB_FILES} <= set(archive.getnames())


def test_the_wheel_serves_the_demo_page_and_its_modules(tmp_path: Path, dist: Path) -> None:
    # Nothing from this checkout may leak in: the venv must import the wheel's copy.
    env = outside_env()
    (wheel,) = dist.glob("voxwire-*.whl")
    venv = tmp_path / "venv"
    python = venv_seeing_these_packages(venv, env)
    run(python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", wheel, cwd=tmp_path, env=env)
    location = run(python, "-c", "import voxwire; print(voxwire.__file__)", cwd=tmp_path, env=env)
    assert Path(location.strip()).is_relative_to(venv), location

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [venv / "bin" / "voxwire", "serve", "--model", "demo", "--host", "127.0.0.1", "--port", str(port),
         "--workers", "0"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while get_status(base + "/ready") != 200:
            assert server.poll() is None, server.stdout.read() if server.stdout else ""
            assert time.monotonic() < deadline, "the server did not become ready"
            time.sleep(0.5)
        status, page = get(base + "/")
        assert status == 200 and page == (ROOT / "client_js" / "index.html").read_bytes()
        # the page's own files, then every module they reach by a relative URL ('./client.js', './worklet.js')
        pending = re.findall(r'(?:src|href)="/client/([\w.]+)"', page.decode())
        served: set[str] = set()
        while pending:
            name = pending.pop()
            if name in served:
                continue
            status, body = get(f"{base}/client/{name}")
            assert status == 200 and body == (ROOT / "client_js" / name).read_bytes(), name
            served.add(name)
            pending += re.findall(r"'\./([\w.]+\.js)'", body.decode())
        assert set(WEB_FILES) - {"index.html"} <= served
        assert get(base + "/client/protocol.test.js")[0] == 404
        # the API page is package data (voxwire/serving/docs.html), and the document it renders is served
        status, page = get(base + "/docs")
        assert status == 200 and page == (ROOT / "server" / "voxwire" / "serving" / "docs.html").read_bytes()
        status, document = get(base + "/openapi.json")
        assert status == 200 and b'"/v1/audio/speech"' in document
    finally:
        server.terminate()
        server.wait(timeout=30)


def get_status(url: str) -> int:
    try:
        return get(url)[0]
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0
