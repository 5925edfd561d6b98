"""``serve``: the one place that picks the server's topology.

One process (the default on a machine without spare cores): the aiohttp app over an engine thread
(``serving.app``). ``--workers N`` or ``--devices``: a supervisor starts the engine processes and the frontend
processes (``serving.workers``), each frontend running the same app over an ``EngineProxy``.
"""

from __future__ import annotations

from voxwire.serving.app import make_app, run_app, run_loop
from voxwire.serving.server_config import ServerConfig
from voxwire.serving.speech.voice_store import check_alias_targets
from voxwire.serving.workers.supervisor import supervise


def serve(config: ServerConfig) -> int:
    """Serve until SIGTERM or SIGINT, draining before the listener closes; the exit status."""
    check_alias_targets(config.voices.voice_aliases, config.voices.voices_dir)  # before any model loads
    if config.topology.frontends > 0:
        return supervise(config)
    app = make_app(config)
    return run_loop(run_app(app, config))
