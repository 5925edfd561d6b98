"""``voxwire serve``: command line → ``ServerConfig`` → the aiohttp app on uvloop, with graceful SIGTERM.

The options are made from ``ServerConfig``'s settings, one per setting, named, typed and helped by its field
(``serving.settings``); only ``--log-level`` is the command's own.

On SIGTERM or SIGINT the server keeps listening while it drains (``/ready`` answers 503, new work is
refused, live utterances finish up to ``--drain-timeout-s``), then closes WebSockets with 1001, stops
the engine and exits 0. The app itself is built by ``voxwire.serving.app.make_app``.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from voxwire.cli import environment

if TYPE_CHECKING:
    from voxwire.serving.server_config import ServerConfig
    from voxwire.serving.settings import Setting

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def register(parser: argparse.ArgumentParser) -> None:
    """One option per ``ServerConfig`` setting, in its group, its help made from the setting's docstring."""
    from voxwire.serving.server_config import ServerConfig
    from voxwire.serving.settings import groups, plain

    parser.description = (
        "Serve a VoxCPM model: WebSocket /v1/tts/stream, POST /v1/audio/speech, voices, "
        "/v1/loras, /health, /ready, /metrics. Every option may also come from the environment variable shown "
        "with it (the command line wins): switches read true/false, 1/0 or yes/no, repeatable options a "
        "comma-separated list, added to the command line's (VOXWIRE_API_KEYS keeps keys out of ps output)."
    )
    parser.formatter_class = environment.HelpFormatter
    for group in groups(ServerConfig):
        options = parser.add_argument_group(group.title, plain(group.doc))
        for setting in group.settings:
            options.add_argument(setting.option, dest=setting.name, **_option(setting))
    parser.add_argument("--log-level", default="INFO", choices=LOG_LEVELS, help="least severe log shown")
    parser.set_defaults(func=run)
    environment.read_from_environment(parser)


def _option(setting: Setting) -> dict[str, Any]:
    """``add_argument``'s keywords for ``setting``: a switch for a bool, else a value of its type."""
    from voxwire.serving.settings import plain

    flag = setting.flag
    shown = f" (default: {plain(flag.shown_default)})" if flag.shown_default else ""
    keywords: dict[str, Any] = {"help": (plain(setting.doc) + shown).replace("%", "%%")}
    if setting.kind is bool:
        switch = argparse.BooleanOptionalAction if setting.default else "store_true"
        return {**keywords, "action": switch, "default": setting.default}
    keywords["type"] = flag.parse or setting.kind
    keywords["metavar"] = flag.metavar or setting.option[2:].upper().replace("-", "_")
    if flag.repeatable:
        return {**keywords, "action": "append", "default": []}
    return {**keywords, "default": setting.default}


def config_from_args(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> ServerConfig:
    """The ``ServerConfig`` the arguments describe, each option missing from them read from its ``VOXWIRE_``
    variable in ``environ`` (default: this process's environment), else its default (``cli.environment``)."""
    return _config(environment.with_environment(args, os.environ if environ is None else environ))


def _config(args: argparse.Namespace) -> ServerConfig:
    """The ``ServerConfig`` of arguments that ``with_environment`` has completed: each setting's option is named
    after it (``dest``); a repeatable option's values are kept once each, in order."""
    from voxwire.serving.server_config import ServerConfig
    from voxwire.serving.settings import groups

    values: dict[str, Any] = {}
    for group in groups(ServerConfig):
        for setting in group.settings:
            value = getattr(args, setting.name)
            values[setting.name] = tuple(dict.fromkeys(value)) if setting.flag.repeatable else value
    return ServerConfig.of(**values)


def run(args: argparse.Namespace) -> int:
    from voxwire.errors import InvalidInputError
    from voxwire.serving.launch import serve

    settings = environment.with_environment(args, os.environ)
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = _config(settings)
    except ValueError as exc:
        raise InvalidInputError(str(exc)) from exc
    transport = config.transport
    if transport.open_to_network:  # only with --no-auth: the config refuses it otherwise
        logging.getLogger(__name__).warning(
            "authentication is off (--no-auth): anyone who reaches %s:%d may use the whole API, voice uploads and "
            "deletes included", transport.host, transport.port,
        )  # fmt: skip
    return serve(config)
