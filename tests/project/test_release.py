"""Releases: one version everywhere (``voxwire.__version__``, checked by scripts/release.py, which the release workflow
runs on the tag), and a release workflow that builds, tests and publishes what it tested. The workflow cannot run
here: its syntax is checked by actionlint where installed, and its steps are read."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.script_modules import load_script

import voxwire

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"
release = load_script(ROOT / "scripts" / "release.py", "voxwire_release")


def test_every_version_in_the_repository_is_voxwire_version() -> None:
    assert release.source_version(ROOT) == voxwire.__version__
    assert release.disagreements(ROOT) == []


def copy_of_the_versioned_files(destination: Path) -> Path:
    for pattern in ("pyproject.toml", "CHANGELOG.md", "README.md", "docs/*.md", "client_js/package*.json",
                    "scripts/deploy/Dockerfile", "scripts/deploy/*.yaml", "scripts/deploy/k8s/base/kustomization.yaml",
                    str(release.SOURCE)):  # fmt: skip
        for path in ROOT.glob(pattern):
            target = destination / path.relative_to(ROOT)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
    return destination


def test_a_version_bumped_in_one_place_only_names_every_place_left_behind(tmp_path: Path) -> None:
    root = copy_of_the_versioned_files(tmp_path)
    source = root / release.SOURCE
    source.write_text(source.read_text().replace(f'"{voxwire.__version__}"', '"9.8.7"'))
    found = "\n".join(release.disagreements(root))
    for place in ("client_js/package.json", "client_js/package-lock.json", "kustomization.yaml", "CHANGELOG.md",
                  "docs/deploy.md: image tag", "scripts/deploy/compose.yaml"):  # fmt: skip
        assert place in found


def test_a_tag_must_name_the_version_and_the_changelog_must_date_it(tmp_path: Path) -> None:
    version = voxwire.__version__
    assert any("the tag v9.9.9" in line for line in release.disagreements(ROOT, tag="v9.9.9"))
    root = copy_of_the_versioned_files(tmp_path)
    changelog = root / "CHANGELOG.md"
    heading = re.compile(rf"^## \[{re.escape(version)}\].*$", flags=re.MULTILINE)
    text = changelog.read_text()
    changelog.write_text(heading.sub(f"## [{version}] - unreleased", text))
    assert any("no release date" in line for line in release.disagreements(root, tag=f"v{version}"))
    changelog.write_text(heading.sub(f"## [{version}] - 2027-01-31", text))
    assert release.disagreements(root, tag=f"v{version}") == []


def workflow() -> dict[str, Any]:
    loaded = yaml.safe_load(WORKFLOW.read_text())
    loaded["on"] = loaded.pop(True, loaded.get("on"))  # YAML 1.1 reads the key `on` as true
    return loaded


def run_lines(job: dict[str, Any]) -> str:
    return "\n".join(step.get("run", "") for step in job["steps"])


def uses(job: dict[str, Any]) -> list[str]:
    return [step["uses"].split("@")[0] for step in job["steps"] if "uses" in step]


def test_the_workflow_runs_on_version_tags_and_checks_the_tag_first() -> None:
    flow = workflow()
    assert flow["on"] == {"push": {"tags": ["v*"]}}
    assert flow["permissions"] == {"contents": "read"}
    for name in ("python", "npm"):
        first_run = next(step["run"] for step in flow["jobs"][name]["steps"] if "run" in step)
        assert "scripts/release.py check --tag" in first_run, name


def test_the_workflow_builds_and_tests_what_it_publishes() -> None:
    jobs = workflow()["jobs"]
    python, npm = run_lines(jobs["python"]), run_lines(jobs["npm"])
    assert "python -m build" in python and "twine check --strict dist/*" in python
    assert "VOXWIRE_DIST" in str(jobs["python"]["steps"]) and "tests/test_wheel.py" in python
    assert "download.pytorch.org/whl/cpu" in python
    assert (ROOT / "tests" / "test_wheel.py").is_file()
    for command in ("npm ci", "node --test", "npm run check-types", "npm pack"):
        assert command in npm
    assert "check-types" in (ROOT / "client_js" / "package.json").read_text()


def test_only_the_publish_jobs_get_an_oidc_token_and_only_after_the_checks() -> None:
    jobs = workflow()["jobs"]
    for name, job in jobs.items():
        token = job.get("permissions", {}).get("id-token")
        assert (token == "write") == name.startswith("publish-"), name
    assert set(jobs["publish-pypi"]["needs"]) == set(jobs["publish-npm"]["needs"]) == {"python", "npm"}
    assert "pypa/gh-action-pypi-publish" in uses(jobs["publish-pypi"])
    assert "actions/download-artifact" in uses(jobs["publish-pypi"])
    assert "npm publish ./voxwire-client-*.tgz --provenance" in run_lines(jobs["publish-npm"])


def test_the_workflow_passes_actionlint() -> None:
    actionlint = shutil.which("actionlint")
    if actionlint is None:
        pytest.skip("actionlint is not installed (https://github.com/rhysd/actionlint: a Go binary, no Debian package)")
    result = subprocess.run([actionlint, str(WORKFLOW)], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
