"""The import graph of a package read from its source (AST, nothing imported): which module imports which, where,
and how. The layer test (``test_layers.py``) holds the package's rules against it.

What counts as an import:

- every ``import`` and ``from ... import`` statement, at module level, inside functions and classes, and inside
  ``if TYPE_CHECKING:`` blocks alike, each edge tagged with its ``ImportKind``. A type-only import is not executed,
  so it cannot break start-up, but it is a dependency of the design all the same: the module's meaning rests on
  the imported type. It counts in full, for cycles and for the layer rules.
- ``from pkg import name`` points at ``pkg.name`` when that is a module of the package, otherwise at ``pkg`` (its
  ``__init__``, which is what runs to hand over ``name``).
- ``import pkg.sub`` points at ``pkg.sub`` alone. Python also runs ``pkg/__init__.py`` first, but a package's
  ``__init__`` re-exporting its own submodules is the usual shape, not a cycle, so parents are not implied; the
  subprocess checks in the tests see what really loads.
- imports by string (``importlib.import_module``) are not in the graph: they name plugins chosen at run time.
"""

from __future__ import annotations

import ast
import enum
import sys
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path


class ImportKind(enum.Enum):
    MODULE = "module level"
    FUNCTION = "inside a function"
    TYPE_CHECKING = "under TYPE_CHECKING"


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    path: Path
    line: int
    kind: ImportKind

    def describe(self, root: Path) -> str:
        return f"{self.source} -> {self.target}  ({self.path.relative_to(root)}:{self.line}, {self.kind.value})"


@dataclass
class ImportGraph:
    """Edges between the package's modules, plus the top-level names of everything imported from outside it."""

    modules: dict[str, Path]
    edges: list[Edge] = field(default_factory=list)
    external: dict[str, list[tuple[str, int, ImportKind]]] = field(default_factory=dict)

    def out_edges(self, module: str) -> list[Edge]:
        return [edge for edge in self.edges if edge.source == module]

    def parts_of(self, package: str) -> ImportGraph:
        """The graph one level up: ``package``'s subpackages and modules as nodes, every import between two of them
        as an edge (keeping the file and line of the import it stands for)."""
        depth = package.count(".") + 2

        def part(module: str) -> str | None:
            return ".".join(module.split(".")[:depth]) if module.startswith(package + ".") else None

        parts = {name: self.modules[name] for name in self.modules if part(name) == name}
        lifted = ImportGraph(parts)
        for edge in self.edges:
            source, target = part(edge.source), part(edge.target)
            if source is not None and target is not None and source != target:
                lifted.edges.append(Edge(source, target, edge.path, edge.line, edge.kind))
        return lifted

    def tangles(self) -> list[set[str]]:
        """The groups of modules that all reach each other (strongly connected components of two or more)."""
        return sorted((group for group in _strongly_connected(self.modules, self.edges) if len(group) > 1), key=min)

    def cycles(self) -> list[list[Edge]]:
        """One circle per tangle, as the edges that close it from its first module back to itself."""
        found = []
        for group in self.tangles():
            start = min(group)
            back = self.shortest_path(start, start, within=group)
            assert back is not None
            found.append(back)
        return found

    def shortest_path(self, start: str, goal: str, within: Iterable[str] | None = None) -> list[Edge] | None:
        """The fewest edges leading from ``start`` to ``goal`` (at least one edge), or None."""
        allowed = set(within) if within is not None else None
        came_by: dict[str, Edge] = {}
        queue = deque([start])
        seen = {start}
        while queue:
            module = queue.popleft()
            for edge in self.out_edges(module):
                if allowed is not None and edge.target not in allowed:
                    continue
                if edge.target == goal:
                    path = [edge]
                    while path[0].source != start:
                        path.insert(0, came_by[path[0].source])
                    return path
                if edge.target not in seen:
                    seen.add(edge.target)
                    came_by[edge.target] = edge
                    queue.append(edge.target)
        return None

    def reachable(self, starts: Iterable[str]) -> dict[str, list[Edge]]:
        """Every module reachable from ``starts`` with one shortest path of edges to it (empty for a start)."""
        paths: dict[str, list[Edge]] = {start: [] for start in starts}
        queue = deque(paths)
        while queue:
            module = queue.popleft()
            for edge in self.out_edges(module):
                if edge.target not in paths:
                    paths[edge.target] = [*paths[module], edge]
                    queue.append(edge.target)
        return paths


def build(package_dir: Path) -> ImportGraph:
    """The import graph of the package in ``package_dir`` (its name is the folder's name)."""
    modules = dict(_modules(package_dir))
    graph = ImportGraph(modules)
    for module, path in modules.items():
        is_package = path.name == "__init__.py"
        for node, kind in _imports(ast.parse(path.read_text(), str(path))):
            for target in _targets(node, module, is_package, modules):
                edge = Edge(module, target, path, node.lineno, kind)
                if target in modules:
                    if target != module and edge not in graph.edges:
                        graph.edges.append(edge)
                else:
                    graph.external.setdefault(module, []).append((target.split(".")[0], node.lineno, kind))
    return graph


def is_standard_library(name: str) -> bool:
    return name in sys.stdlib_module_names or name == "__future__"


def _modules(package_dir: Path) -> Iterator[tuple[str, Path]]:
    for path in sorted(package_dir.rglob("*.py")):
        parts = [package_dir.name, *path.relative_to(package_dir).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        yield ".".join(parts), path


def _imports(tree: ast.Module) -> Iterator[tuple[ast.Import | ast.ImportFrom, ImportKind]]:
    """Every import statement in ``tree`` with the context it runs in (type-checking wins over function)."""

    def walk(node: ast.AST, kind: ImportKind) -> Iterator[tuple[ast.Import | ast.ImportFrom, ImportKind]]:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, kind
            return
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                yield from walk(child, ImportKind.TYPE_CHECKING)
            for child in node.orelse:
                yield from walk(child, kind)
            return
        inner = kind
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and kind is ImportKind.MODULE:
            inner = ImportKind.FUNCTION
        for child in ast.iter_child_nodes(node):
            yield from walk(child, inner)

    yield from walk(tree, ImportKind.MODULE)


def _is_type_checking(test: ast.expr) -> bool:
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, modules: dict[str, Path]) -> list[str]:
    if isinstance(node, ast.Import):
        return [_longest_known(alias.name, modules) for alias in node.names]
    base = node.module or ""
    if node.level:
        anchor = module.split(".") if is_package else module.split(".")[:-1]
        anchor = anchor[: len(anchor) - (node.level - 1)]
        base = ".".join([*anchor, base] if base else anchor)
    targets = []
    for alias in node.names:
        submodule = f"{base}.{alias.name}"
        targets.append(submodule if submodule in modules else _longest_known(base, modules))
    return targets


def _longest_known(name: str, modules: dict[str, Path]) -> str:
    """``name`` itself, or its longest prefix that is a module of the package (``a.b.attr`` -> ``a.b``)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return name


def _strongly_connected(modules: Iterable[str], edges: list[Edge]) -> list[set[str]]:
    """Tarjan's algorithm, iterative (the package is deeper than Python's recursion is comfortable with)."""
    successors: dict[str, list[str]] = {module: [] for module in modules}
    for edge in edges:
        successors[edge.source].append(edge.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []
    for root in successors:
        if root in index:
            continue
        work = [(root, iter(successors[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(successors[child])))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                components.append(component)
    return components
