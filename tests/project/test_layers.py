"""The package's layers, held by a test: no import circle at any level, and the rules that keep the model stack below
the server and the clients beside it (see ``import_graph.py`` for what counts as an import; imports inside
functions and under ``TYPE_CHECKING`` count in full).

The graph is read from the source, so a lazy import cannot hide a circle or an upward arrow; the subprocess checks
at the end confirm the same rules for what really loads at run time.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from tests.project.import_graph import Edge, ImportGraph, build, is_standard_library

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "server" / "voxwire"


@dataclass(frozen=True)
class Rule:
    """Modules under ``sources`` never import modules under ``forbidden``, directly or through another module."""

    name: str
    sources: tuple[str, ...]
    forbidden: tuple[str, ...]


MODEL_STACK = ("voxwire.model", "voxwire.engine", "voxwire.kernels")
APPLICATIONS = ("voxwire.serving", "voxwire.cli", "voxwire.client", "voxwire.integrations")
CLIENT_SIDE = ("voxwire.client", "voxwire.integrations")
SERVER_SIDE = ("voxwire.serving", "voxwire.model", "voxwire.engine")

TRANSPORTS = ("voxwire.serving.http", "voxwire.serving.ws")

RULES = [
    Rule("the model stack stands below every application", MODEL_STACK, APPLICATIONS),
    Rule("clients speak the protocol, never the server or the model", CLIENT_SIDE, SERVER_SIDE),
    Rule("the model's layers never drive the engine", ("voxwire.model",), ("voxwire.engine",)),
    Rule("the transports never reach the process topology", TRANSPORTS, ("voxwire.serving.workers",)),
    Rule("HTTP never reaches the WebSocket transport", ("voxwire.serving.http",), ("voxwire.serving.ws",)),
    Rule("the WebSocket transport never reaches HTTP", ("voxwire.serving.ws",), ("voxwire.serving.http",)),
    Rule(
        "what both transports share stands below them",
        ("voxwire.serving.speech", "voxwire.serving.edge", "voxwire.serving.runtime"),
        (*TRANSPORTS, "voxwire.serving.workers", "voxwire.serving.app"),
    ),
]


@pytest.fixture(scope="module")
def graph() -> ImportGraph:
    return build(PACKAGE)


def under(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == prefix or module.startswith(prefix + ".") for prefix in prefixes)


def show(edges: list[Edge]) -> str:
    return "\n".join("    " + edge.describe(ROOT) for edge in edges)


def test_the_graph_is_read_from_the_whole_package(graph: ImportGraph) -> None:
    # A guard for the rules below: they pass vacuously if the walk finds no module or no edge.
    assert {"voxwire.protocol.wire", "voxwire.engine.runner", "voxwire.serving.app"} <= set(graph.modules)
    runner_imports = {edge.target for edge in graph.out_edges("voxwire.engine.runner")}
    assert any(under(target, ("voxwire.model",)) for target in runner_imports)


def test_no_import_circle_between_modules(graph: ImportGraph) -> None:
    cycles = graph.cycles()
    report = "\n\n".join(f"circle {n + 1}:\n{show(cycle)}" for n, cycle in enumerate(cycles))
    assert not cycles, f"{len(cycles)} import circle(s) between modules:\n{report}"


def test_no_import_circle_between_the_parts_of_any_package(graph: ImportGraph) -> None:
    # One level up from modules: within each package, its subpackages and modules (serving/ws, serving/http, sim,
    # speech_model...) import each other in one direction only, so the package can be drawn as floors with every
    # arrow pointing down.
    found = []
    for package, path in sorted(graph.modules.items()):
        if path.name != "__init__.py":
            continue
        parts = graph.parts_of(package)
        for cycle, members in zip(parts.cycles(), parts.tangles(), strict=True):
            crossing = [edge for edge in parts.edges if edge.source in members and edge.target in members]
            circle = " -> ".join([cycle[0].source, *(edge.target for edge in cycle)])
            found.append(
                f"in {package}: {', '.join(sorted(members))} import each other (one circle: {circle}), "
                f"through\n{show(crossing)}"
            )
    assert not found, "import circle(s) between the parts of a package:\n\n" + "\n\n".join(found)


@pytest.mark.parametrize("rule", RULES, ids=[rule.name for rule in RULES])
def test_layer_rule(graph: ImportGraph, rule: Rule) -> None:
    # Every arrow from the modules the sources reach into the forbidden part, each with one path that leads to it.
    reached = graph.reachable(module for module in graph.modules if under(module, rule.sources))
    violations = [
        [*path, edge]
        for module, path in sorted(reached.items())
        if not under(module, rule.forbidden)
        for edge in graph.out_edges(module)
        if under(edge.target, rule.forbidden)
    ]
    report = "\n\n".join(f"{path[-1].source} -> {path[-1].target}, reached by\n{show(path)}" for path in violations)
    assert not violations, (
        f"{rule.name}: {', '.join(rule.sources)} must not import {', '.join(rule.forbidden)}\n\n{report}"
    )


def test_the_protocol_imports_only_the_standard_library_and_itself(graph: ImportGraph) -> None:
    inside = [edge for edge in graph.edges if under(edge.source, ("voxwire.protocol",))]
    upward = [edge for edge in inside if not under(edge.target, ("voxwire.protocol",))]
    outside = [
        f"    {module} imports {name} (line {line}, {kind.value})"
        for module, imported in sorted(graph.external.items())
        if under(module, ("voxwire.protocol",))
        for name, line, kind in imported
        if not is_standard_library(name)
    ]
    assert not upward, "voxwire.protocol imports the rest of the package:\n" + show(upward)
    assert not outside, "voxwire.protocol imports beyond the standard library:\n" + "\n".join(outside)


def test_the_graph_sees_lazy_and_type_only_imports(tmp_path: Path) -> None:
    # The rules above are only as strong as the walk: an import inside a function or under TYPE_CHECKING is an
    # arrow too, and relative imports resolve to the module they name.
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "low.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.sub import high\n"
    )
    (package / "sub" / "high.py").write_text("def f():\n    from ..low import thing\n    import json\n")
    built = build(package)
    arrows = {(edge.source, edge.target, edge.kind.name) for edge in built.edges}
    assert arrows == {("pkg.low", "pkg.sub.high", "TYPE_CHECKING"), ("pkg.sub.high", "pkg.low", "FUNCTION")}
    assert [[edge.source for edge in cycle] for cycle in built.cycles()] == [["pkg.low", "pkg.sub.high"]]
    assert built.external["pkg.sub.high"][0][0] == "json"


def loaded_after(imports: list[str]) -> list[str]:
    """The names in ``sys.modules`` after a fresh interpreter imports ``imports``."""
    code = f"import json, sys\nfor name in {imports!r}:\n    __import__(name)\nprint(json.dumps(sorted(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def test_the_client_side_loads_neither_the_server_nor_the_model(graph: ImportGraph) -> None:
    # livekit and pipecat modules need their frameworks; tests/test_client_install.py imports those two.
    frameworks = ("voxwire.integrations.livekit", "voxwire.integrations.pipecat")
    client_side = [module for module in graph.modules if under(module, CLIENT_SIDE) and module not in frameworks]
    loaded = loaded_after(client_side)
    heavy = [name for name in loaded if under(name, (*SERVER_SIDE, "torch", "aiohttp"))]
    assert heavy == [], f"importing the client side loaded {heavy}"


def test_the_protocol_loads_only_the_standard_library() -> None:
    # Measured against a bare interpreter, which already holds what site hooks (.pth files) load.
    bare = set(loaded_after([]))
    loaded = loaded_after(["voxwire.protocol.wire", "voxwire.protocol.error_codes"])
    foreign = [
        name
        for name in loaded
        if name not in bare
        and not is_standard_library(name.split(".")[0])
        and not under(name, ("voxwire.protocol",))
        and name != "voxwire"
    ]
    assert foreign == [], f"importing voxwire.protocol loaded {foreign}"
