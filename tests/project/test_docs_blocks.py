"""Every shell and Python block of README, docs/ and client_js/README runs as written against a live server (only
the server's address changed to the test server's, and a tiny checkpoint in place of a real model's weights), or
is listed in EXCEPTIONS with the reason it cannot run here; a new block is run, so a stale page fails."""

from __future__ import annotations

import ast
import re
import shlex
import subprocess
import sys
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import soundfile
import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from tests.project.helpers import (
    COMMAND_TIMEOUT_S,
    DOCS,
    README,
    README_ADDRESS,
    ROOT,
    code_blocks,
    decoded_samples,
    free_names,
    pages_env,
    run_shell,
    section,
    shell_commands,
    written_files,
)
from tests.server_process import ServerProcess
from tests.venvs import outside_env

SHELL_LANGUAGES = ("bash", "sh", "shell", "console")
AUDIO_SUFFIXES = (".wav", ".mp3", ".ogg", ".opus", ".flac", ".aac")

BENCHMARK = "a benchmark or a measurement: from 40 s to many minutes on two cores (its figures are performance.md's)"
REAL_WEIGHTS_SERVER = "serves a real checkpoint downloaded from the internet (a GPU's work); its arguments parse"
UNTIL_STOPPED = "a server that runs until stopped: its arguments parse, and this module's server is the same command"
SOUND_DEVICE = "plays through a sound device, which a test machine has not"
DOCKER = "needs Docker (tests/deploy/test_compose.py runs the compose file where Docker is)"
CLUSTER = "needs a Kubernetes cluster (tests/deploy/test_manifests.py renders and checks the manifests)"
LORA = "needs a LoRA adapter of the reader's own fine-tuning (tests/model/test_lora.py loads the format)"
SYSTEM_NGINX = "writes the system nginx's configuration as root (tests/deploy/test_load_balancers.py runs nginx)"
FRAGMENT = "a fragment of the reader's own program: its imports run and its other names are the reader's"

EXCEPTIONS: dict[tuple[str, str], str] = {
    ("README.md", "python3 -m venv .venv && . .venv/bin/activate"):
        "makes the reader's virtual environment: test_readme_openai_snippet_runs_in_a_fresh_venv runs it",
    ("README.md", "voxwire serve --port 8000"): UNTIL_STOPPED,
    ("README.md", "bash scripts/reference/setup_env.sh"):
        "downloads the reference implementation and its weights from the internet",
    ("README.md", "python -m pytest"):
        "runs the whole suite, this test among it (tests/project/test_suite.py holds CI to these commands)",
    ("README.md", "from pipecat.pipeline.pipeline import Pipeline"): FRAGMENT,
    ("docs/architecture.md", "voxwire serve --model openbmb/VoxCPM2 --workers 6"): REAL_WEIGHTS_SERVER,
    ("docs/clients.md", 'voxwire say "Hello there"'): SOUND_DEVICE,
    ("docs/clients.md", "| aplay"): SOUND_DEVICE,
    ("docs/clients.md", "llm-tool | voxwire say -"): "llm-tool stands for the reader's own program",
    ("docs/clients.md", "voxwire bench --server ws://gpu-box:8000"): BENCHMARK,
    ("docs/clients.md", "voxwire bench --local"): BENCHMARK,
    ("docs/clients.md", "voxwire bench --server URL"): BENCHMARK,
    ("docs/clients.md", "await worker.queue_frame"): FRAGMENT,
    ("docs/clients.md", "--wyoming-port 10200"): REAL_WEIGHTS_SERVER,
    ("docs/clients.md", "ElevenLabsHttpTTSService("): FRAGMENT,
    ("docs/clients.md", "tts.prewarm()"):
        "runs in the reader's agent entrypoint, whose event loop prewarm() needs (tests/serving/integrations/"
        "test_livekit_tts.py drives the plugin)",
    ("docs/deploy.md", "docker compose"): DOCKER,
    ("docs/deploy.md", "--devices cuda:0,cuda:1,cuda:2,cuda:3"): REAL_WEIGHTS_SERVER,
    ("docs/deploy.md", "render.py nginx"): SYSTEM_NGINX,
    ("docs/deploy.md", "cp scripts/deploy/nginx-main.conf /etc/nginx/nginx.conf"): SYSTEM_NGINX,
    ("docs/deploy.md", "nginx -t && nginx -s reload"): SYSTEM_NGINX,
    ("docs/deploy.md", "docker build"): DOCKER,
    ("docs/deploy.md", "docker run"): DOCKER,
    ("docs/deploy.md", "docker push"): DOCKER,
    ("docs/deploy.md", "kubectl"): CLUSTER,
    ("docs/deploy.md", "--tls-cert /etc/voxwire/fullchain.pem"):
        "serves until stopped, with the reader's certificate (tests/serving/test_tls.py serves a generated pair)",
    ("docs/http-api.md", "| aplay"): SOUND_DEVICE,
    ("docs/http-api.md", "schemathesis run"):
        "fuzzes the API for minutes (tests/serving/test_openapi_fuzz.py runs schemathesis against a live server)",
    ("docs/operations.md", "voxwire serve --model openbmb/VoxCPM2"): REAL_WEIGHTS_SERVER,
    ("docs/operations.md", "voxwire serve --host 0.0.0.0 --model openbmb/VoxCPM2"): REAL_WEIGHTS_SERVER,
    ("docs/operations.md", "VOXWIRE_MODEL=openbmb/VoxCPM2"): REAL_WEIGHTS_SERVER,
    ("docs/operations.md", "docker run"): DOCKER,
    ("docs/operations.md", "kubectl"): CLUSTER,
    ("docs/operations.md", ">> scripts/deploy/k8s/base/voxwire.env"): CLUSTER,
    ("docs/operations.md", "voxwire serve --model sim --sim-cost"): UNTIL_STOPPED,
    ("docs/operations.md", "voxwire bench --server ws://127.0.0.1:8000 --concurrency 64,256,768"): BENCHMARK,
    ("docs/operations.md", "--lora ./checkpoints/step_0002000"): LORA,
    ("docs/operations.md", 'lora="./checkpoints/step_0002000"'): LORA,
    ("docs/operations.md", "curl -s localhost:8000/v1/loras"): LORA,
    ("docs/operations.md", '"persona": "narrator"'): LORA,
    ("docs/performance.md", "scripts/gpu_check.py"): "needs a CUDA GPU",
    ("docs/performance.md", ".venv-reference/bin/python"): BENCHMARK,
    ("docs/performance.md", "python scripts/bench_"): BENCHMARK,
    ("docs/performance.md", "python scripts/count_prefill_cost.py"): BENCHMARK,
    ("docs/performance.md", "python scripts/count_step_cost.py"): BENCHMARK,
    ("docs/performance.md", "python scripts/kv_pool_check.py"): BENCHMARK,
    ("docs/performance.md", "python scripts/dit_fp8_error.py"): BENCHMARK,
    ("docs/performance.md", "python scripts/vae_bf16_error.py"): BENCHMARK,
    ("docs/performance.md", "python scripts/simulate_load.py"): BENCHMARK,
    ("docs/performance.md", "scripts/soak.py"): BENCHMARK,
    ("docs/performance.md", "<a 119-word paragraph>"): "the input stands for a paragraph of the reader's",
    ("docs/performance.md", "voxwire bench"): BENCHMARK,
    ("docs/performance.md", "voxwire serve --model sim"): UNTIL_STOPPED,
    ("client_js/README.md", "npm install voxwire-client"):
        "downloads from the npm registry (tests/test_client_install.py installs the packed package)",
}  # fmt: skip
"""Each command of a shell block, or Python block, that does not run here, by page and a snippet of it, with why.
An exception that no longer matches a block fails test_every_exception_matches_a_block."""

PLACEHOLDERS: dict[tuple[str, str], frozenset[str]] = {
    ("README.md", "from pipecat.pipeline.pipeline import Pipeline"):
        frozenset({"transport", "stt", "llm", "user_aggregator", "assistant_aggregator"}),
    ("docs/clients.md", "await worker.queue_frame"):
        frozenset({"transport", "stt", "llm", "user_aggregator", "assistant_aggregator", "worker"}),
    ("docs/clients.md", "ElevenLabsHttpTTSService("): frozenset({"session"}),
    ("docs/clients.md", "play(chunk.audio)"): frozenset({"play"}),
    ("docs/clients.md", "play(piece)"): frozenset({"play"}),
}  # fmt: skip
"""The names a Python block leaves to the reader's own program (the page's text before the block says so)."""
STAND_INS = {"play": "def play(audio):  # the reader's audio output\n    assert len(audio) > 0\n"}
"""What a block that runs gets for a name its reader supplies."""

DRIVERS: dict[tuple[str, str], str] = {
    ("docs/clients.md", "async def speak_into_call"): '''
import asyncio


class Call:
    """The reader's Twilio Media Streams socket: keeps what it is sent."""

    def __init__(self):
        self.sent = []

    async def send(self, message):
        self.sent.append(json.loads(message))


call = Call()
asyncio.run(speak_into_call(call, "MZ0", "Hello there.", seed=7))
assert call.sent and all(m["event"] == "media" and m["streamSid"] == "MZ0" for m in call.sent), call.sent[:2]
''',
}  # fmt: skip
"""Code run after a block that only defines a function: the call the page describes, checked."""

MODEL_STAND_INS = {"openbmb/VoxCPM2": "voxcpm2", "./my-finetune": "voxcpm2", "openbmb/VoxCPM1.5": "voxcpm-44k"}
"""The real checkpoints the pages name, and the tiny checkpoint of the same layout that runs in their place."""
READER_FILES = ("me.wav",)
"""Files the pages assume the reader has (a voice clip): written into the block's working folder first."""


@dataclass(frozen=True)
class Block:
    page: str
    """Relative to the repository root."""
    line: int
    language: str
    text: str

    @property
    def name(self) -> str:
        return f"{self.page}:{self.line}"

    def commands(self) -> list[str]:
        """A shell block's commands (a console block's ``$`` lines), or a Python block whole."""
        if self.language == "python":
            return [self.text]
        if self.language == "console":
            return [line[2:] for line in self.text.splitlines() if line.startswith("$ ")]
        return list(shell_commands(self.text))

    def exception(self, command: str) -> str | None:
        """Why ``command`` of this block does not run here, or None when it runs."""
        return next((why for (page, snippet), why in EXCEPTIONS.items() if page == self.page and snippet in command),
                    None)  # fmt: skip

    def runnable(self) -> list[str]:
        return [command for command in self.commands() if not self.exception(command) and not installs(command)]

    def matches(self, page: str, snippet: str) -> bool:
        return page == self.page and any(snippet in command for command in self.commands())

    def keyed(self, table: Collection[tuple[str, str]]) -> list[str]:
        """The snippets of ``table``'s keys that match a command of this block."""
        return [snippet for page, snippet in table if self.matches(page, snippet)]


def pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md")), ROOT / "client_js" / "README.md"]


def all_blocks() -> list[Block]:
    found = []
    for path in pages():
        text = path.read_text(encoding="utf-8")
        languages = ("python", *SHELL_LANGUAGES) if path.parent != ROOT / "client_js" else SHELL_LANGUAGES
        for match in re.finditer(r"^```(\w+)\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL):
            if match.group(1) in languages:
                line = text.count("\n", 0, match.start()) + 1
                found.append(Block(str(path.relative_to(ROOT)), line, match.group(1), match.group(2)))
    return found


def installs(command: str) -> bool:
    """Whether ``command`` installs packages: never run here (the packages are this environment's), and
    test_every_install_line_names_what_pyproject_has checks what it names."""
    return command.startswith("pip install ")


BLOCKS = all_blocks()


# ---- the classification -------------------------------------------------------------------------------------


def test_the_pages_hold_blocks_of_both_languages() -> None:
    # A guard for the rules below: they pass vacuously if the parser finds no block.
    assert {block.language for block in BLOCKS} >= {"bash", "python", "console"}
    assert len(BLOCKS) > 40


def test_every_exception_matches_a_block() -> None:
    keys = [*EXCEPTIONS, *PLACEHOLDERS, *DRIVERS]
    stale = [key for key in keys if not any(block.matches(*key) for block in BLOCKS)]
    assert not stale, f"exceptions, placeholders or drivers that match no block: {stale}"


def python_tree(block: Block) -> ast.Module:
    flags = ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    tree = compile(block.text, block.name, "exec", flags=flags)
    assert isinstance(tree, ast.Module)
    return tree


PYTHON_BLOCKS = [block for block in BLOCKS if block.language == "python"]


@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=lambda block: block.name)
def test_python_block_imports_and_names_only_what_its_reader_supplies(block: Block) -> None:
    """The block's imports run here, and every other name it reads is one the page's text before it leaves to the
    reader (a name missing its import fails here even where the block cannot run)."""
    tree = python_tree(block)
    placeholders = frozenset().union(*(PLACEHOLDERS[(block.page, key)] for key in block.keyed(PLACEHOLDERS)))
    assert free_names(tree) == placeholders
    lines = (ROOT / block.page).read_text(encoding="utf-8").splitlines()
    before = "\n".join(lines[: block.line - 1]).rsplit("```", 1)[-1]  # from the block before it (or the top)
    for name in placeholders:
        assert name.split("_")[-1] in before, f"{block.name}: the text before it does not say {name} is the reader's"
    imports = ast.Module(body=[node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))],
                         type_ignores=[])  # fmt: skip
    exec(compile(imports, f"{block.name} imports", "exec"), {})


def program_segments(command: str) -> Iterator[list[str]]:
    """The words of each program a shell command runs (split at pipes, ``&&`` and ``;``), its leading
    ``NAME=value`` assignments left out."""
    words = shlex.split(command.split("<<")[0], comments=True)
    segment: list[str] = []
    for word in [*words, "|"]:
        if word in ("|", "&&", ";", "||"):
            while segment and re.fullmatch(r"[A-Z_]+=\S*", segment[0]):
                segment.pop(0)
            if segment:
                yield segment
            segment = []
        else:
            segment.append(word)


def shell_blocks() -> list[Block]:
    return [block for block in BLOCKS if block.language in SHELL_LANGUAGES]


def test_every_voxwire_command_parses() -> None:
    """Every ``voxwire`` command of every page, run here or not, is one the command line accepts: a renamed or
    removed flag fails here even on a page of GPU commands."""
    from voxwire.cli.main import build_parser

    refused = []
    for block in shell_blocks():
        for command in block.commands():
            for words in program_segments(command):
                if words[0] == "voxwire" and "[" not in command:  # brackets: a synopsis of optional flags
                    try:
                        build_parser((words[1],)).parse_args(words[1:])
                    except SystemExit:
                        refused.append(f"{block.name}: {command}")
    assert not refused, "\n".join(refused)


def test_every_repository_path_a_command_names_exists() -> None:
    missing = [
        f"{block.name}: {path}"
        for block in shell_blocks()
        for command in block.commands()
        for path in re.findall(r"(?<![\w/.-])((?:scripts|server|tests|client_js)/[\w./-]*\w)", command)
        if not (ROOT / path).exists()
    ]
    assert not missing, missing


def install_lines() -> list[tuple[str, str]]:
    """(page, command) of every ``pip install`` of the pages: in shell blocks and in their text's code spans."""
    found = []
    for path in pages():
        page = str(path.relative_to(ROOT))
        text = path.read_text(encoding="utf-8")
        found += [(page, line) for line in re.findall(r"`(pip install [^`\n]+)`", text)]
        commands = [command for block in BLOCKS if block.page == page for command in block.commands()]
        parts = [part.strip() for command in commands for part in command.split("&&")]
        found += [(page, part) for part in parts if installs(part)]
    return found


def test_every_install_line_names_what_pyproject_has() -> None:
    """Each extra a page installs exists, and each other package is one an extra lists, at a version it allows."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras: dict[str, list[str]] = project["optional-dependencies"]
    requirements = [Requirement(line) for lines in extras.values() for line in lines]
    listed = {canonicalize_name(requirement.name): requirement for requirement in requirements}
    wrong = []
    for page, command in install_lines():
        words = shlex.split(command, comments=True)[2:]
        wanted = [word for index, word in enumerate(words)
                  if not word.startswith("-") and not words[index - 1].endswith("index-url")]  # fmt: skip
        assert wanted, f"{page}: {command} installs nothing"
        for word in wanted:
            requirement = Requirement(word.replace(".[", "voxwire[", 1) if word.startswith(".[") else word)
            if requirement.name == project["name"]:
                wrong += [f"{page}: {command}: no extra {extra}" for extra in requirement.extras if extra not in extras]
                continue
            ours = listed.get(canonicalize_name(requirement.name))
            pinned = [spec.version for spec in requirement.specifier]
            if ours is None or not all(ours.specifier.contains(version) for version in pinned):
                wrong.append(f"{page}: {command}: {word} is not what pyproject's extras allow ({ours})")
    assert not wrong, "\n".join(wrong)


# ---- the blocks, run -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with ServerProcess("--model", "sim") as process:
        process.wait_ready(timeout=180)
        yield process


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny checkpoint that stands in for each real one a page names."""
    from voxwire.tiny.checkpoint import make_tiny_checkpoint

    folder = tmp_path_factory.mktemp("tiny-models")
    made = {config: make_tiny_checkpoint(folder / config, config) for config in set(MODEL_STAND_INS.values())}
    return {name: made[config] for name, config in MODEL_STAND_INS.items()}


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A fresh folder as the reader's: the repository's scripts/ at hand (the pages run them from the repository
    root), a voice clip of theirs, and ``python`` this interpreter."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "scripts").symlink_to(ROOT / "scripts")
    clip = 0.3 * np.sin(2 * np.pi * 220 * np.arange(16000) / 16000)  # (16000,): 1 s at 16 kHz
    for name in READER_FILES:
        soundfile.write(work / name, clip.astype(np.float32), 16000)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python").symlink_to(sys.executable)
    return work


def as_run_here(command: str, server: ServerProcess, tiny_models: dict[str, Path]) -> str:
    """``command`` with the test server's address for README's, and a tiny checkpoint for each real one."""
    address = server.url.removeprefix("http://")
    ours = command.replace(README_ADDRESS, address).replace("localhost:8000", address)
    if "voxwire say " in ours and "--server" not in ours:
        ours = ours.replace("voxwire say ", f"voxwire say --server ws://{address} ")
    for name, folder in tiny_models.items():
        ours = ours.replace(name, str(folder))
    return ours


def check_written(command: str, work: Path) -> None:
    for name in written_files(command):
        path = work / name
        assert path.is_file() and path.stat().st_size > 0, f"{command}\ndid not write {name}"
        if path.suffix in AUDIO_SUFFIXES:
            assert decoded_samples(path) > 0, f"{command}\nwrote {name}, which holds no audio"


RUNNABLE = [block for block in BLOCKS if block.runnable()]


@pytest.mark.slow
@pytest.mark.parametrize("block", RUNNABLE, ids=lambda block: block.name)
def test_block_runs_as_written(
    block: Block, server: ServerProcess, tiny_models: dict[str, Path], workdir: Path
) -> None:
    env = pages_env(workdir.parent / "bin")
    if block.language == "python":
        stand_ins = [STAND_INS[name] for key in block.keyed(PLACEHOLDERS) for name in PLACEHOLDERS[(block.page, key)]]
        drivers = [DRIVERS[(block.page, key)] for key in block.keyed(DRIVERS)]
        program = "\n".join([*stand_ins, as_run_here(block.text, server, tiny_models), *drivers])
        (workdir / "block.py").write_text(program, encoding="utf-8")
        run_shell("python block.py", workdir, env)
        check_written(block.text, workdir)
    elif block.language == "console":
        for command, shown in console_transcript(block.text):
            if block.exception(command):
                continue
            result = subprocess.run(["bash", "-c", as_run_here(command, server, tiny_models)], cwd=workdir, env=env,
                                    capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)  # fmt: skip
            for line in shown:
                assert line in result.stdout + result.stderr, f"{block.name}: {command}\n{result.stderr}"
    else:
        for command in block.runnable():
            run_shell(as_run_here(command, server, tiny_models), workdir, env)
            check_written(command, workdir)


def console_transcript(text: str) -> list[tuple[str, list[str]]]:
    """A console block's ``$`` commands, each with the output lines the page shows for it."""
    transcript: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("$ "):
            transcript.append((line[2:], []))
        elif line.strip():
            transcript[-1][1].append(line)
    return transcript


@pytest.mark.slow
def test_readme_openai_snippet_runs_in_a_fresh_venv(server: ServerProcess, tmp_path: Path) -> None:
    """README's lines only: its virtual-environment line, the OpenAI section's ``pip install``, then the snippet
    (the packages come from the configured index: a mirror where the machine is offline)."""
    readme = README.read_text(encoding="utf-8")
    venv_line = next(shell_commands(code_blocks(section(readme, "Install and run"), "bash")[0]))
    openai = section(readme, "OpenAI SDK")
    (install,) = re.findall(r"`(pip install [^`]+)`", openai)
    (snippet,) = code_blocks(openai, "python")
    (tmp_path / "snippet.py").write_text(snippet.replace(README_ADDRESS, server.url.removeprefix("http://")))
    script = f"{venv_line}\n{install}\npython snippet.py"
    result = subprocess.run(["bash", "-e", "-c", script], cwd=tmp_path, env=outside_env(), capture_output=True,
                            text=True, timeout=600)  # fmt: skip
    assert result.returncode == 0, f"{script}\n{result.stdout}\n{result.stderr}"
    (name,) = written_files(snippet)
    assert decoded_samples(tmp_path / name) > 0
