"""README is a quickstart that stays true: short, its docs/ index complete, every link resolving (its commands and
snippets run as written in test_docs_blocks.py, with every other page's)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from tests.project.helpers import DOCS, README, ROOT, section

MAX_README_LINES = 250

REQUIRED_HEADINGS: dict[str, tuple[str, ...]] = {
    "architecture.md": ("Layers", "Topologies", "One request's life", "The engine step"),
    "protocol.md": ("Client messages", "Server messages", "Binary audio frames", "Errors and closing"),
    "http-api.md": ("Endpoints", "Errors"),
    "operations.md": (
        "Flags", "Configuration from the environment", "Limits", "Authentication and origins", "Metrics",
        "Draining and shutdown", "Personas (LoRA adapters)",
    ),
    "deploy.md": ("Docker", "Kubernetes", "HAProxy", "nginx", "KEDA"),
    "clients.md": ("`voxwire say`: speak through a server from the shell", "In the browser", "OpenAI SDK"),
    "performance.md": ("GPU check", "Appendix: run history"),
    "correctness.md": ("Parity fixtures", "Streaming equals offline", "Batch invariance"),
}  # fmt: skip
"""The pages README's index must list, each with the headings it promises."""


def read_readme() -> str:
    return README.read_text(encoding="utf-8")


def without_code(markdown: str) -> str:
    """The text outside fenced blocks and inline code spans, where links live."""
    prose = re.sub(r"^```.*?^```", "", markdown, flags=re.MULTILINE | re.DOTALL)
    return re.sub(r"`[^`\n]*`", "", prose)


def headings(markdown: str) -> list[str]:
    prose = re.sub(r"^```.*?^```", "", markdown, flags=re.MULTILINE | re.DOTALL)
    return [match.group(2).strip() for match in re.finditer(r"^(#{1,6}) (.+)$", prose, flags=re.MULTILINE)]


def anchors(markdown: str) -> set[str]:
    """GitHub's anchors for a page's headings: lower case, punctuation dropped, spaces to hyphens, repeats numbered."""
    seen: dict[str, int] = {}
    made = set()
    for heading in headings(markdown):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        made.add(slug if count == 0 else f"{slug}-{count}")
    return made


# ---- structure ---------------------------------------------------------------------------------------------------


def test_readme_is_a_quickstart_of_at_most_250_lines() -> None:
    assert len(read_readme().splitlines()) <= MAX_README_LINES


def test_readme_indexes_every_docs_page_with_its_headings() -> None:
    index = section(read_readme(), "Documentation")
    listed = set(re.findall(r"\]\(docs/([\w-]+\.md)\)", index))
    assert listed == set(REQUIRED_HEADINGS)
    assert {path.name for path in DOCS.glob("*.md")} == set(REQUIRED_HEADINGS)
    for page, required in REQUIRED_HEADINGS.items():
        present = headings((DOCS / page).read_text(encoding="utf-8"))
        missing = [heading for heading in required if heading not in present]
        assert not missing, f"docs/{page} lacks the headings {missing}"


def test_deploy_page_has_the_five_deployment_headings_at_top_level() -> None:
    text = (DOCS / "deploy.md").read_text(encoding="utf-8")
    for name in ("Docker", "Kubernetes", "HAProxy", "nginx", "KEDA"):
        assert re.search(rf"^## {name}$", text, flags=re.MULTILINE), name


def markdown_files() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


@pytest.mark.parametrize("page", markdown_files(), ids=lambda path: str(path.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", without_code(text)):
        if re.match(r"[a-z][a-z+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked.read_text(encoding="utf-8")):
            broken.append(f"{target} (no such heading)")
    assert not broken, f"{page.name}: {broken}"


@pytest.mark.parametrize("page", markdown_files(), ids=lambda path: str(path.relative_to(ROOT)))
def test_every_table_is_whole(page: Path) -> None:
    """A table is one run of ``|`` lines, its header then its ``|---|`` line: a row cut off by a blank line starts
    a run without one, which renders as a stray line of text (as docs/http-api's ``/openapi.json`` row once did)."""
    prose = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.MULTILINE | re.DOTALL)
    runs = re.findall(r"(?:^\|.*\n?)+", prose, flags=re.MULTILINE)
    broken = [run.splitlines()[0] for run in runs if len(run.splitlines()) < 2 or
              not re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", run.splitlines()[1].strip())]  # fmt: skip
    assert not broken, f"{page.name}: table lines without a header: {broken}"


def test_protocol_modules_point_at_the_normative_spec() -> None:
    for module in ("server/voxwire/protocol/wire.py", "client_js/protocol.js"):
        assert "docs/protocol.md" in (ROOT / module).read_text(encoding="utf-8"), module
