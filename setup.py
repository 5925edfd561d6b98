"""Build hook: the wheel carries the browser library and demo page from ``client_js/`` as ``voxwire/web/``.

Everything else about the package is in pyproject.toml. An editable install skips the copy: the server then
serves ``client_js/`` from the repository itself (``voxwire.serving.app.CLIENT_DIR``).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
WEB_SUFFIXES = frozenset({".js", ".css", ".html"})  # the screenshot is for the docs only


def web_files() -> list[Path]:
    """The page and its modules: what the server serves (tests and package.json stay behind)."""
    return sorted(
        path
        for path in (ROOT / "client_js").iterdir()
        if path.is_file() and path.suffix in WEB_SUFFIXES and not path.name.endswith(".test.js")
    )


class BuildWithWebFiles(build_py):
    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return
        target = Path(self.build_lib) / "voxwire" / "web"
        target.mkdir(parents=True, exist_ok=True)
        for path in web_files():
            shutil.copy2(path, target / path.name)


setup(cmdclass={"build_py": BuildWithWebFiles})
