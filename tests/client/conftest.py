"""Client tests reuse the serving fixtures: the real app in process, on a free port, with the tiny model."""

from __future__ import annotations

from tests.serving.conftest import app_factory, persona_app, serve

__all__ = ["app_factory", "persona_app", "serve"]
