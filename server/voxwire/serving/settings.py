"""What a ``voxwire serve`` setting is: a field of a config group, described once, by its docstring.

``ServerConfig`` (serving/server_config.py) is made of groups: frozen dataclasses whose fields are the settings. A
field's docstring, the string under it, is the setting's only description: ``voxwire serve --help`` shows it as
the flag's help (``plain``) and ``python scripts/flag_docs.py`` writes it into docs/operations.md's tables. It is
written in the docs' markdown: ``code`` spans and [links](page.md#anchor) relative to docs/operations.md.

A field is the flag ``--`` + its name in kebab case, taking a value of its annotated type: ``max_sessions: int``
is ``--max-sessions N``; a bool is a switch (``--batch-invariant``, or ``--realtime``/``--no-realtime`` when it
defaults to on). ``metadata=flag(...)`` adds what the name and the type cannot say (``Flag``). Setting names are unique
across the groups, as flags are, so a flat name finds its group (``ServerConfig.of(max_sessions=2)``).
"""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, fields
from functools import cache
from typing import Any

DOCS_PAGE = "operations.md"
"""The page of docs/ that holds the settings' tables: docstrings' links are relative to it."""


_FLAG = "voxwire.flag"
"""The key of a field's ``Flag`` in its ``metadata``."""


@dataclass(frozen=True)
class Flag:
    """How a setting is given on the command line, beyond what its name and type say."""

    shown_default: str | None = None
    """The default as help and docs show it, when it is a rule rather than a value (``the hostname``); needed for
    a default of None or of an empty tuple, and for one computed from the machine."""
    repeatable: bool = False
    """A tuple given one value per flag (``--api-key a --api-key b``), a value given twice counting once; the
    flag is the field's name in the singular: ``api_keys`` is ``--api-key``, ``voice_aliases`` ``--voice-alias``."""
    parse: Callable[[str], Any] | None = None
    """Makes the value (a repeatable flag's item) of the flag's text; default: the annotated type. It raises
    ``argparse.ArgumentTypeError`` with the message to show for bad text."""
    metavar: str | None = None
    """The value's placeholder in ``--help`` (``NAME=DIR``); default: the flag's name in capitals."""


def flag(**attributes: Any) -> dict[str, Flag]:
    """A field's ``metadata`` with its ``Flag``: ``field(default=(), metadata=flag(repeatable=True))``."""
    return {_FLAG: Flag(**attributes)}


@dataclass(frozen=True)
class Setting:
    """One setting of a group, described for the command line and the docs."""

    name: str
    """Its field's name, also the flat name ``ServerConfig.of`` takes (``max_connections``)."""
    doc: str
    """Its docstring, in the docs' markdown."""
    kind: type
    """The type of its value (``int``, ``float``, ``str``, ``bool``, ``Path``; ``tuple`` made by ``Flag.parse``),
    of one item for a repeatable flag."""
    default: Any
    """Its default (a computed one, computed now)."""
    flag: Flag

    @property
    def option(self) -> str:
        """Its flag: ``--max-connections``; ``--api-key`` for the repeatable ``api_keys``."""
        name = _singular(self.name) if self.flag.repeatable else self.name
        return "--" + name.replace("_", "-")


def _singular(name: str) -> str:
    """``api_keys`` -> ``api_key``, ``voice_aliases`` -> ``voice_alias``."""
    return name.removesuffix("es") if name.endswith("ses") else name.removesuffix("s")


@dataclass(frozen=True)
class GroupDoc:
    """A group as ``--help`` and the docs show it: its title, its docstring and its settings in field order."""

    name: str
    title: str
    doc: str
    settings: tuple[Setting, ...]


def groups(config: type) -> tuple[GroupDoc, ...]:
    """The groups of ``config``: a dataclass whose every field is a group, made by its default factory, with a
    ``title`` (a ClassVar) for ``--help`` and the docs."""
    found = []
    for member in fields(config):
        group: Any = member.default_factory  # a group class: its ``title`` is a ClassVar
        found.append(GroupDoc(member.name, group.title, inspect.cleandoc(group.__doc__ or ""), _settings(group)))
    return tuple(found)


def plain(doc: str) -> str:
    """A docstring as terminal text: one line, no code marks, links as their text and page (``docs/page.md``)."""
    text = re.sub(r"\]\(#", f"]({DOCS_PAGE}#", " ".join(doc.split()))
    text = re.sub(r"\[([^]]+)\]\(([^)#]+)(#[^)]*)?\)", r"\1 (docs/\2)", text)
    return text.replace("``", "")


def _settings(group: type) -> tuple[Setting, ...]:
    docs = _field_docs(group)
    hints = typing.get_type_hints(group)
    made = []
    for member in fields(group):
        if member.name not in docs:
            raise TypeError(f"{group.__name__}.{member.name} has no docstring: it is the setting's help")
        flag: Flag = member.metadata.get(_FLAG, Flag())
        default = member.default_factory() if callable(member.default_factory) else member.default
        kind = _value_type(f"{group.__name__}.{member.name}", hints[member.name], flag)
        made.append(Setting(member.name, docs[member.name], kind, default, flag))
    return tuple(made)


def _value_type(where: str, hint: Any, flag: Flag) -> type:
    """The type a flag's text becomes: ``int`` of ``int | None``, ``str`` of a repeatable ``tuple[str, ...]``."""
    if isinstance(hint, types.UnionType):
        (hint,) = (arg for arg in typing.get_args(hint) if arg is not type(None))
    if typing.get_origin(hint) is not tuple:
        if not isinstance(hint, type):
            raise TypeError(f"{where}: a setting's type is a class (int, str, Path...) or a tuple of them, not {hint}")
        return hint
    item = typing.get_args(hint)[0]
    if flag.repeatable and (flag.parse or isinstance(item, type)):
        return item if isinstance(item, type) else tuple
    if flag.parse is None:
        raise TypeError(f"{where}: a tuple is a repeatable flag or one parsed from its text (Flag.parse)")
    return tuple


@cache
def _field_docs(group: type) -> dict[str, str]:
    """The docstring under each field of ``group``, read from its source (Python keeps no attribute docstrings)."""
    (body,) = ast.parse(textwrap.dedent(inspect.getsource(group))).body
    assert isinstance(body, ast.ClassDef)
    docs = {}
    for statement, after in zip(body.body, body.body[1:], strict=False):
        if not (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)):
            continue
        if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str):
            docs[statement.target.id] = inspect.cleandoc(after.value.value)
    return docs
