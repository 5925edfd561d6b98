"""The suite's own rules, held by reading its source: test modules take shared code from conftest.py or helper modules,
never from another test module; every test whose result depends on the CPU's instruction set carries the ``isa``
mark (.ci/run runs those again with ATen, MKL and oneDNN held to AVX2); .ci/run runs README's test commands in
the virtual environment README makes.

A test's result depends on the instruction set when it holds audio or tensors that torch computes bit for bit
(``np.array_equal``, ``np.testing.assert_array_equal``, ``torch.equal``) or to a rounding-error bound
(``tests/bounds.py``), or compares them with what the reference implementation recorded (a safetensors file under
``tests/fixtures/reference``) or computes now (its environment, ``VOXWIRE_REFERENCE_VENV``). The test is read with
every function and fixture of its module that it reaches. ``NOT_TORCH_NUMERICS`` lists the modules whose exact
comparisons are of data torch does not compute, with the reason.
"""

from __future__ import annotations

import ast
import functools
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"

EXACT_CALLS = {
    "np.array_equal",
    "numpy.array_equal",
    "np.testing.assert_array_equal",
    "numpy.testing.assert_array_equal",
    "torch.equal",
    "assert_within",
}
"""Assertions of bit-exact results, and ``tests/bounds.py``'s bound (derived to hold on any CPU: the AVX2 run
checks)."""

NOT_TORCH_NUMERICS = {
    "tests/audio/test_codecs.py": "FLAC is lossless: PyAV's codec, not torch",
    "tests/audio/test_pcm.py": "integer PCM encodings",
    "tests/audio/test_resample.py": "soxr's resampler, chunked or whole",
    "tests/audio/test_tempo.py": "the tempo stretcher's numpy code, chunked or whole",
    "tests/audio/test_whole_files.py": "FLAC is lossless: PyAV's codec against the integer PCM encoding",
    "tests/engine/test_async_engine.py": "the fake runner's chunks",
    "tests/engine/test_devices.py": "an upload's copy of each tensor",
    "tests/engine/test_engine.py": "the fake runner's chunks",
    "tests/engine/test_policy.py": "the fake runner's chunks",
    "tests/model/test_loader.py": "weights as loaded from their files",
    "tests/model/test_voice_clip.py": "a clip pickled to another process",
    "tests/serving/test_probe_voices.py": "clip files decoded by PyAV",
    "tests/serving/test_voices.py": "latents saved and read back",
    "tests/sim/test_sim_runner.py": "the sim model's recorded clip",
    "tests/sim/test_sim_serve.py": "the sim model's recorded clip",
    "tests/workers/test_ipc.py": "step outputs pickled to another process",
}


def suite_modules() -> list[Path]:
    return sorted(TESTS.rglob("test_*.py"))


def relative(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def dotted(node: ast.expr) -> str | None:
    """``a.b.c`` for an attribute chain on a name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def is_mark(node: ast.expr, name: str) -> bool:
    """Whether ``node`` is ``pytest.mark.<name>`` (called or not), or a list or tuple holding one."""
    if isinstance(node, (ast.List, ast.Tuple)):
        return any(is_mark(element, name) for element in node.elts)
    if isinstance(node, ast.Call):
        node = node.func
    return dotted(node) == f"pytest.mark.{name}"


@dataclass
class Module:
    """A test module's functions, what each reaches in the module, and the marks on it."""

    path: Path
    tree: ast.Module

    @functools.cached_property
    def functions(self) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
        return {node.name: node for node in self.tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}

    def tests(self) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
        return [node for name, node in self.functions.items() if name.startswith("test_")]

    def marked(self, name: str) -> bool:
        """The whole module carries ``pytest.mark.<name>`` (``pytestmark``)."""
        return any(
            isinstance(node, ast.Assign)
            and any(isinstance(target, ast.Name) and target.id == "pytestmark" for target in node.targets)
            and is_mark(node.value, name)
            for node in self.tree.body
        )

    @functools.cached_property
    def reference_names(self) -> set[str]:
        """Module-level names bound to the reference's recorded data (a path under fixtures/reference) or to its
        environment."""
        names = set()
        for node in self.tree.body:
            if isinstance(node, ast.Assign):
                strings = {c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant)}
                if "reference" in strings or "VOXWIRE_REFERENCE_VENV" in strings:
                    names |= {target.id for target in node.targets if isinstance(target, ast.Name)}
        return names

    def reached(self, test: ast.FunctionDef | ast.AsyncFunctionDef) -> Iterator[ast.AST]:
        """Every node of ``test`` and of the module's functions and fixtures it names or requests, transitively."""
        functions = self.functions
        pending, seen = [test], {test.name}
        while pending:
            function = pending.pop()
            names = {node.id for node in ast.walk(function) if isinstance(node, ast.Name)}
            names |= {argument.arg for argument in function.args.args + function.args.kwonlyargs}
            for name in sorted(names & functions.keys() - seen):
                seen.add(name)
                pending.append(functions[name])
            yield from ast.walk(function)

    def depends_on_the_isa(self, test: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
        references = self.reference_names
        for node in self.reached(test):
            if isinstance(node, ast.Call):
                name = dotted(node.func)
                if name in EXACT_CALLS and relative(self.path) not in NOT_TORCH_NUMERICS:
                    return True
                if name == "load_file" and {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} & references:
                    return True  # the tensors the reference recorded
            if isinstance(node, ast.Name) and node.id in references and "VENV" in node.id:
                return True  # the reference's environment
        return False


@functools.cache
def modules() -> list[Module]:
    return [Module(path, ast.parse(path.read_text(encoding="utf-8"))) for path in suite_modules()]


def test_the_rules_read_the_whole_suite() -> None:
    # A guard for the rules below: they pass vacuously if the walk finds no module or no test.
    found = {relative(module.path): module for module in modules()}
    assert len(found) > 100
    runner = found["tests/engine/test_model_runner.py"]
    bit_exact = runner.functions["test_batch_invariant_sessions_sound_bit_for_bit_as_alone"]
    assert runner.depends_on_the_isa(bit_exact)
    parity = found["tests/model/test_reference_parity.py"]
    assert parity.depends_on_the_isa(parity.functions["test_bf16_steps_match_reference_teacher_forced"])
    assert not runner.depends_on_the_isa(runner.functions["test_a_request_longer_than_the_pool_is_refused_at_add"])
    assert set(NOT_TORCH_NUMERICS) <= set(found), "a module listed as not torch numerics is gone"


def test_every_test_that_depends_on_the_instruction_set_carries_the_isa_mark() -> None:
    unmarked = [
        f"{relative(module.path)}::{test.name}"
        for module in modules()
        if not module.marked("isa")
        for test in module.tests()
        if module.depends_on_the_isa(test) and not any(is_mark(d, "isa") for d in test.decorator_list)
    ]
    assert not unmarked, "bit-exact or parity tests without @pytest.mark.isa:\n" + "\n".join(unmarked)


def imported_test_modules(module: Module) -> Iterator[tuple[int, str]]:
    """(line, module) of each import of a test module of the suite (relative, or under ``tests.``)."""
    for node in ast.walk(module.tree):
        names = []
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("tests.")):
            names = [node.module or "", *(alias.name for alias in node.names if not node.module)]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names if alias.name.startswith("tests.")]
        for name in names:
            if name.rsplit(".", 1)[-1].startswith("test_"):
                yield node.lineno, name


def test_no_test_module_imports_another() -> None:
    """Shared test code lives in conftest.py or a helper module: importing a test module runs its collection-time
    code again under another name and hides what is shared."""
    found = [
        f"{relative(module.path)}:{line} imports {name}"
        for module in modules()
        for line, name in imported_test_modules(module)
    ]
    assert not found, "\n".join(found)


def readme_test_lines(start: str) -> list[str]:
    """The lines of README's Test section that start with ``start``, stripped."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    [section] = re.findall(r"^## Test\n(.*?)(?=^## )", readme, flags=re.MULTILINE | re.DOTALL)
    return [line.strip() for line in section.splitlines() if line.startswith(start)]


def ci_commands() -> list[str]:
    """.ci/run's commands, one a line (comments left out), each normalized (``shlex``) and without its
    ``|| status=$?``."""
    script = (ROOT / ".ci" / "run").read_text(encoding="utf-8").replace("\\\n", " ")  # continued lines joined
    lines = [line.split("||")[0].split("  #")[0].strip() for line in script.splitlines()]
    return [normalized(line) for line in lines if line and not line.startswith("#")]


def normalized(command: str) -> str:
    return shlex.join(shlex.split(command))


def test_ci_runs_readme_test_commands_in_a_venv_made_as_readme_says() -> None:
    """A newcomer runs README's test commands inside the virtual environment README makes: CI does the same (its
    interpreter and site-packages are not the system's, issue 33 item 8), and runs part of the suite on the system's
    python3 after it, so both ways stay green."""
    commands, [make_venv] = readme_test_lines("python -m pytest"), readme_test_lines("python3 -m venv")
    assert commands, "README names no test command"
    script, make_venv = ci_commands(), normalized(make_venv)
    assert make_venv in script, f".ci/run does not make README's virtual environment: {make_venv}"
    inside = script[script.index(make_venv) : script.index("deactivate")]
    for command in commands:
        assert normalized(command) in inside, f"{command} does not run in README's venv in .ci/run"
    after = script[script.index("deactivate") :]
    assert any("python3 -m pytest" in line for line in after), "no part of the suite runs on the system's python3"


@pytest.mark.parametrize("mark", ["isa", "alone"])
def test_ci_runs_each_marked_phase(mark: str) -> None:
    script = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert re.search(rf"-m pytest .*-m {mark}\b", script), f".ci/run runs no `-m {mark}` phase"
