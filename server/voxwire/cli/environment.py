"""Every option of a command also read from an environment variable: ``--max-sessions`` from ``VOXWIRE_MAX_SESSIONS``.

Containers and Kubernetes configure a service through its environment; the rule is derived from the argparse
definition, so an option is described once and its variable comes with it:

* the variable is ``VOXWIRE_`` and the option's long name without its dashes, upper-cased, dashes made
  underscores; a repeatable option's variable is plural: ``--api-key`` reads ``VOXWIRE_API_KEYS``;
* a value is read as on the command line (the option's type and choices); a switch (``--batch-invariant``,
  ``--realtime``/``--no-realtime``) reads ``true``/``false``, ``1``/``0`` or ``yes``/``no``; a repeatable option
  a comma-separated list; blanks around a value or an item are ignored, and an empty variable counts as unset,
  but for a repeatable option's: one that is set must list a value, since an empty list is what turns a safeguard
  off (an empty ``VOXWIRE_API_KEYS``, say from an empty Secret, would serve without authentication);
* the command line wins over the variable and the variable over the default; a repeatable option takes the
  values of both (the command line's first);
* a bad value raises ``InvalidInputError`` naming the variable, which the CLI prints on one line (exit 2).

``read_from_environment(parser)`` marks the options of a parser as not given (``NotGiven``, which ``--help``
shows as the default); ``with_environment(args, environ)`` fills each one in from its variable or its default.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator, Mapping
from typing import Any

from voxwire.errors import InvalidInputError

PREFIX = "VOXWIRE_"
TRUE_WORDS = ("true", "1", "yes")
FALSE_WORDS = ("false", "0", "no")
_OPTIONS = "environment_options"
"""The namespace attribute that carries the parser's options from parsing to ``with_environment``."""


class NotGiven:
    """The parsed value of an option absent from the command line, until ``with_environment`` replaces it by the
    option's variable or ``default``; ``--help`` shows it as ``default``."""

    def __init__(self, default: Any) -> None:
        self.default = default

    def __str__(self) -> str:
        return str(self.default)

    def __repr__(self) -> str:
        return f"NotGiven({self.default!r})"


def options(parser: argparse.ArgumentParser) -> Iterator[argparse.Action]:
    """The parser's options that have a variable: all but ``--help`` (and ``--version``) and positionals."""
    return filter(_has_variable, parser._actions)  # argparse lists its actions nowhere public


def variable(action: argparse.Action) -> str:
    """The variable of an option: ``--max-sessions`` -> ``VOXWIRE_MAX_SESSIONS``, ``--api-key`` (repeatable) ->
    ``VOXWIRE_API_KEYS``."""
    long = next(option for option in action.option_strings if option.startswith("--"))
    name = PREFIX + long[2:].upper().replace("-", "_")
    return name + "S" if _repeatable(action) else name


def read_from_environment(parser: argparse.ArgumentParser) -> None:
    """Make every option of ``parser`` readable from its variable (resolved by ``with_environment``)."""
    found = tuple(options(parser))
    for action in found:
        if action.nargs not in (None, 0) or (action.nargs == 0 and not _switch(action)):
            raise TypeError(f"{action.option_strings[0]}: no environment syntax for this kind of option")
        if not _repeatable(action):  # a repeatable option's default is its empty list: its variable adds to it
            action.default = NotGiven(action.default)
    parser.set_defaults(**{_OPTIONS: found})


def with_environment(args: argparse.Namespace, environ: Mapping[str, str]) -> argparse.Namespace:
    """``args`` with each option missing from the command line read from its variable in ``environ``, or else
    its default. Raises ``InvalidInputError`` naming the variable of a bad value."""
    resolved = argparse.Namespace(**vars(args))
    for action in vars(resolved).pop(_OPTIONS):
        given, name = getattr(args, action.dest), variable(action)
        text = environ.get(name, "").strip()
        if _repeatable(action):
            items = [item.strip() for item in text.split(",")]
            if name in environ and not any(items):
                raise InvalidInputError(
                    f"{name}: set but lists no value; list one at least (comma-separated) or unset it"
                )
            value = [*(given or ()), *(_parse(action, name, item, None) for item in items if item)]
        elif isinstance(given, NotGiven):
            value = _parse(action, name, text, given.default) if text else given.default
        else:
            value = given
        setattr(resolved, action.dest, value)
    return resolved


def _parse(action: argparse.Action, name: str, text: str, default: Any) -> Any:
    """The value ``text`` gives the option, as its command line would."""
    if action.nargs == 0:
        word = text.lower()
        if word not in TRUE_WORDS + FALSE_WORDS:
            raise InvalidInputError(f"{name}: invalid boolean value: {text!r} (true/false, 1/0 or yes/no)")
        on = word in TRUE_WORDS
        return on if isinstance(action, argparse.BooleanOptionalAction) else action.const if on else default
    convert = action.type if callable(action.type) else str
    try:
        value = convert(text)
    except argparse.ArgumentTypeError as exc:
        raise InvalidInputError(f"{name}: {exc}") from None
    except (TypeError, ValueError):
        kind = getattr(convert, "__name__", repr(convert))
        raise InvalidInputError(f"{name}: invalid {kind} value: {text!r}") from None
    if action.choices is not None and value not in action.choices:
        choices = ", ".join(map(repr, action.choices))
        raise InvalidInputError(f"{name}: invalid choice: {text!r} (choose from {choices})")
    return value


def _has_variable(action: argparse.Action) -> bool:
    return bool(action.option_strings) and action.default is not argparse.SUPPRESS


def _repeatable(action: argparse.Action) -> bool:
    return isinstance(action, argparse._AppendAction)


def _switch(action: argparse.Action) -> bool:
    """An option that takes no value: it sets its constant (``store_true``), or true/false (``--x/--no-x``)."""
    return isinstance(action, argparse.BooleanOptionalAction | argparse._StoreConstAction)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Ends each option's help with its default and its variable: ``TCP port (default: 8000) [env: VOXWIRE_PORT]``.
    A help that states its default itself (a rule: ``(default: the hostname)``) is not given a second one."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        stated = action.help is not None and "(default: " in action.help
        text = action.help if stated else super()._get_help_string(action)
        if not _has_variable(action):
            return text
        return f"{text or ''} [env: {variable(action)}]".lstrip()
