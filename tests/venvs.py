"""Fresh virtual environments with this checkout installed, as a user outside the repository gets it, and the
reference implementation's environment (``scripts/reference/setup_env.sh``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).parents[1]
REFERENCE_VENV = Path(os.environ.get("VOXWIRE_REFERENCE_VENV", ROOT / ".venv-reference"))
"""The reference's environment. CI builds it and sets ``VOXWIRE_REQUIRE_REFERENCE=1``, so there a missing one fails."""


def reference_python() -> Path:
    """The reference environment's python; skips the test without one (fails it where it is required)."""
    import pytest

    python = REFERENCE_VENV / "bin" / "python"
    if not python.is_file():
        message = f"no reference environment at {REFERENCE_VENV}: run bash scripts/reference/setup_env.sh"
        if os.environ.get("VOXWIRE_REQUIRE_REFERENCE") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return python


def outside_env() -> dict[str, str]:
    """This process's environment without PYTHONPATH: nothing from the checkout leaks into a venv's imports."""
    return {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}


def venv_seeing_these_packages(venv: Path, env: dict[str, str]) -> Path:
    """A new venv at ``venv`` that imports what this interpreter has installed (torch and the other dependencies:
    nothing is downloaded) under its own packages; its python. ``--system-site-packages`` alone gives only the base
    Python's packages, which inside a virtual environment (as README's test commands run) lack them: this
    environment's site-packages are added behind the new venv's own, as the base's are."""
    run(sys.executable, "-m", "venv", "--system-site-packages", venv, cwd=venv.parent, env=env)
    python = venv / "bin" / "python"
    if sys.prefix != sys.base_prefix:
        where = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
        own = Path(run(python, "-c", where, cwd=venv.parent, env=env).strip())
        outer = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
        (own / "outer-environment.pth").write_text("".join(f"{path}\n" for path in sorted(outer)))
    return python


def run(*command: str | Path, cwd: Path, env: dict[str, str]) -> str:
    """Run ``command``; its stdout, after asserting it succeeded (the assertion shows its output)."""
    result = subprocess.run([str(part) for part in command], cwd=cwd, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def copy_sources(destination: Path) -> Path:
    """What a build reads (sources, client_js, metadata, what the sdist carries), copied so a build leaves nothing
    in the checkout."""
    ignore = shutil.ignore_patterns("__pycache__", "node_modules", "*.egg-info")
    for folder in ("server", "client_js"):
        shutil.copytree(ROOT / folder, destination / folder, ignore=ignore)
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "CHANGELOG.md", "LICENSE"):
        shutil.copy2(ROOT / name, destination / name)
    return destination
