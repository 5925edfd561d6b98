"""README is a quickstart that stays true: short, its docs/ index complete, every link resolving, and its quick-start
commands run as written against a real server (only the host and port changed to the test server's)."""

from __future__ import annotations

import ast
import builtins
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.server_process import ServerProcess

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MAX_README_LINES = 250
README_ADDRESS = "127.0.0.1:8000"
"""The server address README's commands use; the tests put their own server's in its place."""
COMMAND_TIMEOUT_S = 120

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

SNIPPET_PLACEHOLDERS = {
    "Pipecat": {"transport", "stt", "llm", "user_aggregator", "assistant_aggregator"},
    "LiveKit Agents": set(),
}
"""Names a framework snippet leaves to the reader's own pipeline (README's text before the snippet says so)."""


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


def section(markdown: str, title: str) -> str:
    """The body of the section under heading ``title``, up to the next heading of the same or a higher level."""
    heading = re.search(rf"^(#+) {re.escape(title)}$", markdown, flags=re.MULTILINE)
    assert heading, f"no section {title!r}"
    body = markdown[heading.end() :]
    end = re.search(rf"^#{{1,{len(heading.group(1))}}} ", body, flags=re.MULTILINE)
    return body[: end.start()] if end else body


def code_blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)


def shell_commands(block: str) -> Iterator[str]:
    """A bash block's commands: continuation lines joined, comments and blank lines left out."""
    for command in re.sub(r"\\\n\s*", " ", block).splitlines():
        if command.strip() and not command.lstrip().startswith("#"):
            yield command.strip()


def quick_start_commands(program: str) -> list[str]:
    found = [
        command
        for block in code_blocks(section(read_readme(), "Quick starts"), "bash")
        for command in shell_commands(block)
        if re.search(rf"(^|\| ){program} ", command)
    ]
    assert found, f"README's quick starts show no {program} command"
    return found


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


# ---- the quick starts, run ---------------------------------------------------------------------------------------


def decoded_samples(path: Path) -> int:
    """Samples per channel of the audio in ``path``, decoded by FFmpeg (PyAV); fails on anything undecodable."""
    import av

    assert path.is_file() and path.stat().st_size > 0, f"{path.name} was not written"
    with av.open(str(path)) as container:
        return sum(frame.samples for frame in container.decode(audio=0))


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with ServerProcess("--model", "demo") as process:
        process.wait_ready(timeout=180)
        yield process


def readme_env() -> dict[str, str]:
    """The environment the commands run in: the console scripts next to this interpreter come first."""
    scripts = str(Path(sys.executable).parent)
    return {**os.environ, "PATH": scripts + os.pathsep + os.environ.get("PATH", "")}


def run_shell(command: str, cwd: Path) -> None:
    result = subprocess.run(
        ["bash", "-o", "pipefail", "-c", command], cwd=cwd, env=readme_env(), capture_output=True, text=True,
        timeout=COMMAND_TIMEOUT_S,
    )  # fmt: skip
    assert result.returncode == 0, f"{command}\nexit {result.returncode}\n{result.stdout}\n{result.stderr}"


def written_files(command: str) -> list[str]:
    """The files a command writes: ``--out FILE`` (``voxwire say``) and ``-o FILE`` (curl)."""
    return [name for flag, name in re.findall(r"(--out|-o) (\S+)", command) if name != "-"]


@pytest.mark.slow
def test_readme_voxwire_say_commands_write_audio_that_decodes(server: ServerProcess, tmp_path: Path) -> None:
    for command in quick_start_commands("voxwire say"):
        ours = command.replace(
            "voxwire say ", f"voxwire say --server {shlex.quote(server.url.replace('http://', 'ws://'))} "
        )
        run_shell(ours, tmp_path)
        (name,) = written_files(command)
        assert decoded_samples(tmp_path / name) > 0, command


@pytest.mark.slow
def test_readme_curl_commands_write_audio_that_decodes(server: ServerProcess, tmp_path: Path) -> None:
    address = server.url.removeprefix("http://")
    for command in quick_start_commands("curl"):
        assert README_ADDRESS in command, command
        run_shell(command.replace(README_ADDRESS, address), tmp_path)
        (name,) = written_files(command)
        assert decoded_samples(tmp_path / name) > 0, command


@pytest.mark.slow
def test_readme_openai_sdk_snippet_writes_audio_that_decodes(
    server: ServerProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("openai")
    (snippet,) = code_blocks(section(read_readme(), "OpenAI SDK"), "python")
    assert f"http://{README_ADDRESS}/v1" in snippet
    monkeypatch.chdir(tmp_path)
    exec(compile(snippet.replace(f"http://{README_ADDRESS}", server.url), "README OpenAI SDK", "exec"), {})
    (name,) = re.findall(r'stream_to_file\("([^"]+)"\)', snippet)
    assert decoded_samples(tmp_path / name) > 0


def free_names(tree: ast.Module) -> set[str]:
    """Names the code reads that it neither imports nor assigns, nor are builtins."""
    bound = set(dir(builtins))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            bound.add(node.id)
    loaded = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}
    return loaded - bound


@pytest.mark.parametrize(("title", "framework"), [("Pipecat", "pipecat"), ("LiveKit Agents", "livekit.agents")])
def test_readme_framework_snippet_compiles_and_imports_every_name_it_uses(title: str, framework: str) -> None:
    pytest.importorskip(framework)
    (snippet,) = code_blocks(section(read_readme(), title), "python")
    tree = ast.parse(snippet, filename=f"README {title}")
    assert free_names(tree) == SNIPPET_PLACEHOLDERS[title]
    placeholders_named = section(read_readme(), title).split("```")[0]
    for name in SNIPPET_PLACEHOLDERS[title]:
        assert name.split("_")[-1] in placeholders_named, f"README does not say {name} is the reader's own"
    imports = ast.Module(body=[node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))],
                         type_ignores=[])  # fmt: skip
    exec(compile(imports, f"README {title} imports", "exec"), {})
