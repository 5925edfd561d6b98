"""The project has one name: nothing in the tree may carry the old one, which belongs to another PyPI package."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OLD_NAME = "vox" + "stream"  # spelled in two parts so this file does not match itself


def tracked_files() -> list[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout to list the tracked files")
    listing = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True).stdout
    return [name for name in listing.decode().split("\0") if name]


def test_no_tracked_path_carries_the_old_name() -> None:
    assert [name for name in tracked_files() if OLD_NAME in name.lower()] == []


def test_no_tracked_file_contains_the_old_name_in_any_case() -> None:
    offenders = []
    for name in tracked_files():
        path = ROOT / name
        if path.is_file() and OLD_NAME.encode() in path.read_bytes().lower():
            offenders.append(name)
    assert offenders == []
