"""What the tests of README and docs/ share: the pages' sections and fenced blocks, a shell block's commands, the
environment the commands run in, and the audio files they write, decoded."""

from __future__ import annotations

import ast
import builtins
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
README_ADDRESS = "127.0.0.1:8000"
"""The server address the pages' commands use; the tests put their own server's in its place."""
COMMAND_TIMEOUT_S = 120
"""The longest one command of a page may run: a command that needs longer is a benchmark, listed as an exception."""


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
    """A shell block's commands: continuation lines joined, a here-document kept with the command that reads it,
    comments and blank lines left out."""
    lines = iter(re.sub(r"\\\n\s*", " ", block).splitlines())
    for line in lines:
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        command = line.strip()
        here_document = re.search(r"<<-?\s*'?(\w+)'?", command)
        if here_document:
            body = []
            for body_line in lines:
                body.append(body_line)
                if body_line.strip() == here_document.group(1):
                    break
            command = "\n".join([command, *body])
        yield command


def decoded_samples(path: Path) -> int:
    """Samples per channel of the audio in ``path``, decoded by FFmpeg (PyAV); fails on anything undecodable."""
    import av

    assert path.is_file() and path.stat().st_size > 0, f"{path.name} was not written"
    with av.open(str(path)) as container:
        return sum(frame.samples for frame in container.decode(audio=0))


def pages_env(bin_dir: Path | None = None) -> dict[str, str]:
    """The environment the pages' commands run in: the console scripts next to this interpreter come first (and
    ``bin_dir``, when given, before them)."""
    scripts = [str(bin_dir)] if bin_dir else []
    path = os.pathsep.join([*scripts, str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return {**os.environ, "PATH": path}


def run_shell(command: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``command`` with bash (a failing stage of a pipe fails it); asserts that it succeeded."""
    result = subprocess.run(
        ["bash", "-o", "pipefail", "-c", command], cwd=cwd, env=env or pages_env(), capture_output=True, text=True,
        timeout=COMMAND_TIMEOUT_S,
    )  # fmt: skip
    assert result.returncode == 0, f"{command}\nexit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result


def written_files(command: str) -> list[str]:
    """The files a command writes: ``--out FILE`` (``voxwire say``, ``synth``, scripts), ``-o FILE`` (curl),
    ``> FILE`` (a redirect) and ``stream_to_file("FILE")`` (the OpenAI SDK)."""
    flagged = re.findall(r"(?:^|(?<=\s))(?:--out|-o|>) (\S+)", command)  # "-> None" in Python is no redirect
    named = flagged + re.findall(r'stream_to_file\("([^"]+)"\)', command)
    return [name for name in named if name != "-"]


def free_names(tree: ast.Module) -> set[str]:
    """Names the code reads that it neither imports nor assigns (nor defines, nor takes as parameters), nor are
    builtins."""
    bound = set(dir(builtins))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            bound.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    loaded = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}
    return loaded - bound
