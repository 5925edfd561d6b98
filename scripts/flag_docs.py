"""Write the ``voxwire serve`` flag tables of docs/operations.md from the settings' docstrings
(serving/server_config.py).

A setting is described once, by its field's docstring in ``ServerConfig``'s groups; ``--help`` and these tables
are made from it. The page marks where the tables go, naming the groups each place holds:

    <!-- flag tables: engine topology (written by python scripts/flag_docs.py) -->
    ...
    <!-- end of flag tables -->

Every group is in one place, as its docstring and its table; a place with several groups puts each under a
heading with its title. Run it after changing a setting; tests/project/test_flag_docs.py fails while the page
differs from what it writes.

    python scripts/flag_docs.py            # rewrite docs/operations.md
    python scripts/flag_docs.py --check    # exit 1 if the page is out of date
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "server"))

from voxwire.serving.server_config import ServerConfig  # noqa: E402
from voxwire.serving.settings import DOCS_PAGE, GroupDoc, Setting, groups  # noqa: E402

PAGE = ROOT / "docs" / DOCS_PAGE
PLACE = re.compile(
    r"(?P<start><!-- flag tables: (?P<groups>[\w ]+?) \(written by python scripts/flag_docs\.py\) -->\n)"
    r"(?P<body>.*?)"
    r"(?P<end><!-- end of flag tables -->)",
    flags=re.DOTALL,
)


def render(page: str) -> str:
    """``page`` with every marked place holding the tables of its groups, as the code describes them now."""
    by_name = {group.name: group for group in groups(ServerConfig)}
    placed = [name for match in PLACE.finditer(page) for name in match["groups"].split()]
    if sorted(placed) != sorted(by_name):
        raise ValueError(f"{PAGE.name} places the groups {placed}; each of {sorted(by_name)} must be placed once")

    def fill(match: re.Match[str]) -> str:
        chosen = [by_name[name] for name in match["groups"].split()]
        return match["start"] + _tables(chosen) + match["end"]

    return PLACE.sub(fill, page)


def _tables(chosen: list[GroupDoc]) -> str:
    if len(chosen) == 1:
        return f"{_markdown(chosen[0].doc)}\n\n{_table(chosen[0])}\n"
    return "".join(f"### {group.title}\n\n{_markdown(group.doc)}\n\n{_table(group)}\n" for group in chosen)


def _table(group: GroupDoc) -> str:
    rows = [f"| {_flag(s)} | {_default(s)} | {_markdown(s.doc)} |" for s in group.settings]
    return "\n".join(["| flag | default | what |", "|---|---|---|", *rows]) + "\n"


def _flag(setting: Setting) -> str:
    if setting.kind is bool and setting.default:
        return f"`{setting.option}` / `--no-{setting.option[2:]}`"
    metavar = f" {setting.flag.metavar}" if setting.flag.metavar else ""
    return f"`{setting.option}{metavar}`"


def _default(setting: Setting) -> str:
    """The default as a reader wants it: a rule in words, on/off, a number, a word in code."""
    value = setting.default
    if setting.flag.shown_default:
        return _markdown(setting.flag.shown_default)
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return f"`{value}`"
    raise TypeError(f"--{setting.name}: say how its default {value!r} reads (shown_default)")


def _markdown(doc: str) -> str:
    """A docstring as one table cell: one line, RST's double backquotes made markdown's single ones."""
    return " ".join(doc.split()).replace("``", "`").replace("|", "\\|")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 if the page differs from what it would write")
    args = parser.parse_args()
    page = PAGE.read_text(encoding="utf-8")
    written = render(page)
    if args.check:
        if written != page:
            print(f"docs/{PAGE.name} is out of date: run python scripts/flag_docs.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(written, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
