#!/usr/bin/env python3
"""Check every version written in the repository against the one source, ``voxwire.__version__``.

    python scripts/release.py check                # every place agrees (tests/project/test_release.py runs it)
    python scripts/release.py check --tag v0.2.0   # and the tag names that version, and CHANGELOG.md dates it

The wheel and the sdist take their version from ``voxwire.__version__`` itself (pyproject.toml's dynamic
version); the other places a release must agree with are written out: the npm package (package.json and its
lock file), CHANGELOG.md's newest section, and the ``voxwire:X.Y.Z`` image tags of the deployment kit and the
docs. The release workflow (.github/workflows/release.yml) runs the ``--tag`` form before it builds anything, so a
tag that disagrees with the files publishes nothing. Exits 1 listing each place that disagrees.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = Path("server/voxwire/__init__.py")
PYPROJECT_VERSION = 'version = { attr = "voxwire.__version__" }'
"""pyproject.toml's line that makes the package's version ``voxwire.__version__``."""
IMAGE_TAG = re.compile(r"\bvoxwire:(\d+\.\d+\.\d+(?:(?:a|b|rc|\.dev|\.post)\d+)?)")
"""A local image tag such as ``voxwire:0.1.0`` (a registry's ``.../voxwire:0.1.0`` too)."""
IMAGE_TAG_FILES = ("README.md", "docs/*.md", "scripts/deploy/Dockerfile", "scripts/deploy/*.yaml")
CHANGELOG_SECTION = re.compile(r"^## \[(?P<version>[^\]]+)\](?: - (?P<date>\S+))?", flags=re.MULTILINE)
"""A released section's heading, Keep a Changelog style: ``## [0.2.0] - 2027-01-31``; ``[Unreleased]`` too."""


def source_version(root: Path = ROOT) -> str:
    """``__version__`` as server/voxwire/__init__.py writes it (read, not imported: no dependency is needed)."""
    found = re.search(r'^__version__ = "([^"]+)"$', (root / SOURCE).read_text(encoding="utf-8"), flags=re.MULTILINE)
    if found is None:
        raise SystemExit(f'{SOURCE}: no __version__ = "..." line')
    return found.group(1)


def released_sections(root: Path) -> list[tuple[str, str | None]]:
    """CHANGELOG.md's sections, newest first: (version, date or None), ``Unreleased`` left out."""
    text = (root / "CHANGELOG.md").read_text(encoding="utf-8")
    return [
        (match["version"], match["date"])
        for match in CHANGELOG_SECTION.finditer(text)
        if match["version"].lower() != "unreleased"
    ]


def disagreements(root: Path = ROOT, tag: str | None = None) -> list[str]:
    """Each place whose version is not ``voxwire.__version__``, as ``file: what it says``; empty when all agree."""
    version = source_version(root)
    found: list[str] = []
    if PYPROJECT_VERSION not in (root / "pyproject.toml").read_text(encoding="utf-8"):
        found.append(f"pyproject.toml: the version is not taken from voxwire.__version__ ({PYPROJECT_VERSION})")
    package = json.loads((root / "client_js/package.json").read_text(encoding="utf-8"))
    if package["version"] != version:
        found.append(f"client_js/package.json: version {package['version']}")
    lock = json.loads((root / "client_js/package-lock.json").read_text(encoding="utf-8"))
    for where, locked in (("version", lock["version"]), ('packages[""].version', lock["packages"][""]["version"])):
        if locked != version:
            found.append(f"client_js/package-lock.json: {where} {locked}")
    kustomization = (root / "scripts/deploy/k8s/base/kustomization.yaml").read_text(encoding="utf-8")
    image = re.search(r"- name: voxwire\n\s+newName: \S+\n\s+newTag: (\S+)", kustomization)
    if image is None or image.group(1) != version:
        found.append(f"scripts/deploy/k8s/base/kustomization.yaml: the voxwire image's newTag {image and image[1]}")
    for pattern in IMAGE_TAG_FILES:
        for path in sorted(root.glob(pattern)):
            for tagged in sorted(set(IMAGE_TAG.findall(path.read_text(encoding="utf-8"))) - {version}):
                found.append(f"{path.relative_to(root)}: image tag voxwire:{tagged}")
    sections = released_sections(root)
    if not sections or sections[0][0] != version:
        found.append(f"CHANGELOG.md: the newest section is {sections[0][0] if sections else 'missing'}")
    if tag is not None:
        if tag != f"v{version}":
            found.append(f"the tag {tag} is not v{version}")
        dated = dict(sections).get(version)
        if dated is None or not re.fullmatch(r"\d{4}-\d{2}-\d{2}", dated):
            found.append(f"CHANGELOG.md: the [{version}] section has no release date (## [{version}] - YYYY-MM-DD)")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check", help="every version agrees with voxwire.__version__")
    check.add_argument("--tag", help="the release's git tag (v<version>): also check it and the changelog's date")
    args = parser.parse_args(argv)
    found = disagreements(ROOT, args.tag)
    version = source_version()
    for line in found:
        print(f"{line} (voxwire.__version__ is {version})", file=sys.stderr)
    if not found:
        print(f"every version is {version}")
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
