"""``PersonaRegistry``: the server's view of the model's LoRA personas (``voxstream.model.personas``).

Every transport checks a persona's name here before it starts work (``check``: an unknown name is an
``UnknownPersonaError``, the same ``unknown_persona`` code on the WebSocket, the OpenAI endpoint and the
``/v1/loras`` API). Loading reads files and briefly holds the engine's step lock, so it runs on a worker
thread, never on the event loop. Removing a persona lets the requests already holding it finish; new ones
are refused. A persona removed between ``check`` and the engine's prefill ends that request in error.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from voxstream.errors import ModelLoadError, VoxstreamError
from voxstream.model.personas import PersonaError
from voxstream.serving.config import ServerConfig, is_persona_name
from voxstream.tts import VoxCPM


class UnknownPersonaError(VoxstreamError):
    """No persona has this name (never loaded, or removed)."""


class PersonaLoadError(VoxstreamError):
    """A persona could not be added; ``code`` is stable (``invalid_name``, ``invalid_path``,
    ``persona_exists``, ``persona_limit``, ``invalid_lora``, ``lora_too_large``)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class PersonaInfo:
    """A registered persona, as ``GET /v1/loras`` lists it."""

    name: str
    path: str
    rank: int
    alpha: float
    lm: bool
    dit: bool
    projections: bool
    in_use: int
    """Requests holding it now."""

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name, "object": "lora", "path": self.path, "rank": self.rank, "alpha": self.alpha,
            "targets": {"lm": self.lm, "dit": self.dit, "projections": self.projections}, "in_use": self.in_use,
        }  # fmt: skip


def check_persona(personas: PersonaRegistry | None, persona: str | None) -> None:
    """Raise ``UnknownPersonaError`` unless ``persona`` is None (the base model) or loaded in ``personas``."""
    if persona is None:
        return
    if personas is None:
        raise UnknownPersonaError(f"unknown persona {persona!r}: this server has no personas")
    personas.check(persona)


class PersonaRegistry:
    """Names → adapters of one model; the model's ``PersonaBank`` is made with the configured capacity."""

    def __init__(self, tts: VoxCPM, config: ServerConfig) -> None:
        self.tts = tts
        self.config = config
        self._lock = asyncio.Lock()
        """Serializes adds, so two loads of one name cannot both pass the existence check."""

    def _bank_names(self) -> list[str]:
        bank = self.tts.personas
        return [] if bank is None else list(bank.adapters)

    def names(self) -> list[str]:
        return sorted(self._bank_names())

    def check(self, name: str | None) -> None:
        """Raise ``UnknownPersonaError`` unless ``name`` is None (the base model) or a registered persona."""
        if name is not None and name not in self._bank_names():
            known = ", ".join(self.names()) or "none are loaded"
            raise UnknownPersonaError(f"unknown persona {name!r} (personas: {known})")

    def infos(self) -> list[PersonaInfo]:
        bank = self.tts.personas
        if bank is None:
            return []
        with bank.lock:
            adapters = dict(bank.adapters)
            users = {name: bank.users(name) for name in adapters}
        infos = []
        for name, adapter in sorted(adapters.items()):
            lora = adapter.config
            targets = (lora.enable_lm, lora.enable_dit, lora.enable_proj)
            infos.append(PersonaInfo(name, adapter.source, adapter.rank, lora.alpha, *targets, users[name]))
        return infos

    def targets(self) -> dict[str, list[str]]:
        """The modules the registered personas adapt, by the reference config's keys (``GET /info``)."""
        bank = self.tts.personas
        configs = [adapter.config for adapter in bank.adapters.values()] if bank is not None else []
        keys = ("target_modules_lm", "target_modules_dit", "target_proj_modules")
        return {key: sorted({module for lora in configs for module in getattr(lora, key)}) for key in keys}

    def load_configured(self) -> None:
        """Load ``config.loras`` (blocking: at startup, before the server reports ready)."""
        for name, path in self.config.loras:
            self._load(name, Path(path))

    async def add(self, name: str, path: str) -> PersonaInfo:
        """Load the checkpoint folder ``path`` (on the server) as ``name``, off the event loop."""
        if not is_persona_name(name):
            raise PersonaLoadError("invalid_name", "a persona name is 1-64 letters, digits or ._-")
        folder = self._folder(path)
        async with self._lock:
            if name in self._bank_names():
                raise PersonaLoadError("persona_exists", f"persona {name!r} exists; delete it first")
            if len(self._bank_names()) >= self.config.max_loras:
                limit = self.config.max_loras
                raise PersonaLoadError("persona_limit", f"{limit} personas are loaded (max_loras); delete one first")
            await asyncio.to_thread(self._load, name, folder)
        return next(info for info in self.infos() if info.name == name)

    def remove(self, name: str) -> None:
        """Forget ``name``: requests holding it finish with it, new ones get ``unknown_persona``."""
        bank = self.tts.personas
        try:
            if bank is None:
                raise PersonaError(f"unknown persona {name!r}")
            bank.remove(name)
        except PersonaError as exc:
            raise UnknownPersonaError(str(exc)) from None

    def _folder(self, path: str) -> Path:
        if not path or "\0" in path:
            raise PersonaLoadError("invalid_path", "'path' must name a LoRA checkpoint folder on the server")
        folder = Path(path).expanduser().resolve()
        root = self.config.lora_root
        if root is not None and not folder.is_relative_to(root.expanduser().resolve()):
            raise PersonaLoadError("invalid_path", f"'path' must be inside the server's LoRA root ({root})")
        if not folder.is_dir():
            raise PersonaLoadError("invalid_path", f"{path!r} is not a folder on the server")
        return folder

    def _load(self, name: str, folder: Path) -> None:
        self.tts.enable_personas(self.config.max_personas, self.config.max_lora_rank)
        try:
            self.tts.load_persona(name, folder)
        except ModelLoadError as exc:
            raise PersonaLoadError("invalid_lora", str(exc)) from exc
        except PersonaError as exc:  # a rank above max_lora_rank
            raise PersonaLoadError("lora_too_large", str(exc)) from exc
