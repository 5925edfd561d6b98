"""The deployment tests reuse the serving fixtures (the real app in process, with the tiny model) for probe checks."""

from __future__ import annotations

from tests.serving.conftest import app_factory, serve

__all__ = ["app_factory", "serve"]
