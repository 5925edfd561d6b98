"""What mypy checks strictly, read from ``pyproject.toml``, and the ``type: ignore`` comments of the package.

``python tests/project/strict_types.py`` prints the strict share of the package's lines and each ignore.

- The strict modules are the patterns of the ``[[tool.mypy.overrides]]`` entry that sets ``disallow_untyped_defs``
  (``--strict``'s flags, set per module there). A pattern matches as mypy matches it: ``voxwire.client.*`` is
  ``voxwire.client`` and every module under it.
- A module's lines are its file's newlines (as architecture-review-2 counted them: comments and docstrings too).
- An ignore is a comment that starts with ``type: ignore``; it is justified when it names its error codes
  (``type: ignore[override]``) and a second comment on the same line says why.
"""

from __future__ import annotations

import io
import re
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "server" / "voxwire"

_IGNORE = re.compile(r"#\s*type:\s*ignore(?P<codes>\[[^\]]*\])?(?P<rest>.*)")
_REASON = re.compile(r"\s*#\s*\S")


def module_name(path: Path) -> str:
    """``server/voxwire/serving/edge/auth.py`` -> ``voxwire.serving.edge.auth``; a package is its ``__init__``."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    """Every module of the package, by name."""
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def lines(path: Path) -> int:
    return path.read_text().count("\n")


def strict_patterns() -> list[str]:
    """The module patterns mypy checks strictly (``pyproject.toml``)."""
    overrides = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]["overrides"]
    (strict,) = (override for override in overrides if override.get("disallow_untyped_defs"))
    return list(strict["module"])


def matches(pattern: str, module: str) -> bool:
    """Whether mypy's override ``pattern`` applies to ``module`` (its rule: ``.*`` is zero or more parts)."""
    parts = pattern.split(".")
    tail = "".join(r"(\..*)?" if part == "*" else re.escape("." + part) for part in parts[1:])
    expression = re.escape(parts[0]) + tail
    return re.fullmatch(expression, module) is not None


def strict_modules(patterns: list[str]) -> set[str]:
    return {name for name in modules() if any(matches(pattern, name) for pattern in patterns)}


def strict_share() -> float:
    """The strict modules' lines over the package's lines."""
    files = modules()
    strict = strict_modules(strict_patterns())
    return sum(lines(files[name]) for name in strict) / sum(lines(path) for path in files.values())


@dataclass(frozen=True)
class Ignore:
    """One ``type: ignore`` comment."""

    path: Path
    line: int
    comment: str

    @property
    def justified(self) -> bool:
        """It names its error codes and says why, on its line."""
        found = _IGNORE.match(self.comment)
        assert found is not None
        return found["codes"] is not None and _REASON.match(found["rest"]) is not None

    def __str__(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}: {self.comment}"


def ignores() -> Iterator[Ignore]:
    """The package's ``type: ignore`` comments (read as comments: a string that mentions one is not one)."""
    for path in modules().values():
        tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
        for token in tokens:
            if token.type == tokenize.COMMENT and _IGNORE.match(token.string):
                yield Ignore(path, token.start[0], token.string)


if __name__ == "__main__":
    print(f"strict: {strict_share():.1%} of server/voxwire's lines")
    for ignore in ignores():
        print(ignore)
