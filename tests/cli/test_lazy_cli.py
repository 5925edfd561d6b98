"""The ``voxwire`` command imports a subcommand only when it runs, and the server's need the ``server`` extra.

A client-only install has no torch, aiohttp, PyAV or pyzmq; tests/test_client_install.py runs ``say`` and
``bench`` in one. Here: no subcommand's arguments pull those in, and a missing extra is one clear line.
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from voxwire.cli import main as cli

ROOT = Path(__file__).parents[2]
SERVER_ONLY = ("torch", "aiohttp", "av", "zmq")


@pytest.mark.parametrize("argv", [["--help"], *([command.name, "--help"] for command in cli.SUBCOMMANDS)])
def test_registering_arguments_imports_no_server_dependency(argv: list[str]) -> None:
    code = (
        "import sys\nfrom voxwire.cli.main import main\n"
        f"try:\n    main({argv!r})\nexcept SystemExit as exit:\n    assert exit.code == 0, exit.code\n"
        f"print(sorted(name for name in {SERVER_ONLY!r} if name in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "[]", f"voxwire {' '.join(argv)} imported {result.stdout.splitlines()[-1]}"


def test_a_client_subcommand_imports_no_other_subcommand() -> None:
    code = (
        "import sys\nfrom voxwire.cli.main import main\n"
        "try:\n    main(['say', '--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted(name for name in sys.modules if name.startswith('voxwire.cli.')))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.splitlines()[-1] == "['voxwire.cli.main', 'voxwire.cli.say']"


@pytest.mark.parametrize("command", [command.name for command in cli.SUBCOMMANDS if command.needs_server])
def test_server_subcommands_without_the_extra_exit_2_naming_the_install(
    command: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "SERVER_EXTRA_MODULES", ("torch", "voxwire_test_absent_module"))
    assert cli.main([command, "--help"]) == 2
    assert cli.main([command]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 2 and lines[0] == lines[1]
    assert lines[0] == (
        f"voxwire {command}: error: needs the server extra (voxwire_test_absent_module not installed): "
        "pip install 'voxwire[server]'"
    )


def test_client_subcommands_do_not_need_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "SERVER_EXTRA_MODULES", ("voxwire_test_absent_module",))
    with pytest.raises(SystemExit) as exit:
        cli.main(["say", "--help"])
    assert exit.value.code == 0


def test_the_checked_modules_are_the_server_extra() -> None:
    """``SERVER_EXTRA_MODULES`` is pyproject.toml's ``server`` extra by import name (platform-only ones aside)."""
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["server"]
    required = {
        re.match(r"[A-Za-z0-9._-]+", requirement).group().lower().replace("_", "-")
        for requirement in extra
        if ";" not in requirement
    }
    providers = importlib.metadata.packages_distributions()
    checked = {
        distribution.lower().replace("_", "-")
        for module in cli.SERVER_EXTRA_MODULES
        for distribution in providers[module]
    }
    assert checked == required
