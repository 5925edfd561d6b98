"""The flag tables of docs/operations.md are what scripts/flag_docs.py writes from the settings' docstrings, so a
setting is described once: change a docstring, a default or a flag, and this fails until the page is rewritten."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from tests.script_modules import load_script

from voxwire.cli.main import build_parser
from voxwire.serving.server_config import ServerConfig
from voxwire.serving.settings import groups

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "flag_docs.py"


def flag_docs() -> ModuleType:
    return load_script(SCRIPT, "voxwire_flag_docs")


def serve_options() -> list[str]:
    subparsers = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return [option for action in subparsers.choices["serve"]._actions for option in action.option_strings]


def test_the_committed_tables_are_what_the_code_writes() -> None:
    page = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    assert flag_docs().render(page) == page, "docs/operations.md is out of date: run python scripts/flag_docs.py"


def test_the_check_command_passes_on_the_committed_page() -> None:
    result = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_every_serve_flag_has_a_row_and_every_row_a_flag() -> None:
    page = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    rows = [line for line in page.splitlines() if line.startswith("| `--")]
    documented = {line.split("`")[1].split()[0] for line in rows}
    documented |= {line.split("`")[3] for line in rows if "` / `--no-" in line}
    settings = {setting.option for group in groups(ServerConfig) for setting in group.settings}
    assert documented == settings | {"--no-realtime"}
    assert set(serve_options()) == settings | {"--no-realtime", "--log-level", "-h", "--help"}


def test_a_page_that_leaves_out_a_group_is_refused() -> None:
    page = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    with pytest.raises(ValueError, match="each of"):
        flag_docs().render(page.replace("flag tables: limits (", "flag tables: audio ("))


def test_a_stale_row_is_rewritten() -> None:
    page = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    stale = page.replace("| `--max-sessions` | 16 |", "| `--max-sessions` | 8 |")
    assert stale != page and flag_docs().render(stale) == page
