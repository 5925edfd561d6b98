"""Client tests reuse the serving fixtures: the real app in process, on a free port, with the tiny model; and
``sim_app``, the real app over the simulated model (``--model sim``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from aiohttp import web
from tests.serving.conftest import app_factory, persona_app, serve

from voxwire.serving.app import make_app
from voxwire.serving.server_config import ServerConfig
from voxwire.sim.model import SimSpeech

__all__ = ["app_factory", "persona_app", "serve", "sim_app"]


@pytest.fixture
def sim_app() -> Callable[..., web.Application]:
    """``sim_app(**overrides)``: an app over ``SimSpeech`` with ``voxwire serve --model sim``'s defaults (real-time
    pacing on), a free port, a short drain, and no refusal for the step time (the suite shares the CPU: a step here
    is as slow as the machine is busy)."""

    def build(**overrides: Any) -> web.Application:
        settings: dict[str, Any] = {"port": 0, "drain_timeout_s": 10.0, "max_step_load": 1000.0, **overrides}
        return make_app(ServerConfig.of(**settings), model=SimSpeech())

    return build
