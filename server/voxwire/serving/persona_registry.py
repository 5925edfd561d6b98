"""LoRA personas on the model's side: ``PersonaRegistry`` over one model's bank (``voxwire.model.personas``),
``open_registry`` that sets it up at start-up, and ``LocalPersonas``, the single-process server's ``Personas``.

Personas are set up at start-up or not at all: with ``--lora`` or ``--lora-root`` the model's layers that
personas may adapt are reserved before the engine captures its graphs (``reserve``: the reference's default
targets, attention q/k/v/o of both LMs and the DiT plus the projections, and every layer a ``--lora`` persona
adapts), and from then on a persona is loaded by copying its weights into them. A persona adapting any other
layer is refused (``invalid_lora``); a server started with neither has no adapted layers (nothing slows its
steps) and refuses ``POST /v1/loras`` (``personas_unavailable``).

``PersonaRegistry`` is plain blocking code: the single-process server wraps it in ``LocalPersonas`` (loads on
a worker thread, never on the event loop); with ``--workers`` each engine process owns one, and the frontends
reach it over IPC (``workers.remote_personas.RemotePersonas``). Only processes that hold the model import this
module (it imports the model's code, hence torch); the handlers use ``serving.personas``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from voxwire.errors import InvalidInputError, ModelLoadError
from voxwire.model.lora import LoRAConfig
from voxwire.model.personas import PersonaError, UnreservedLayersError
from voxwire.serving.config import ServerConfig, is_persona_name
from voxwire.serving.personas import TARGET_KEYS, PersonaInfo, PersonaLoadError, UnknownPersonaError
from voxwire.speech_model import SpeechModel, VoxCPMSpeech
from voxwire.tts import VoxCPM

RESERVED_TARGETS = LoRAConfig(enable_lm=True, enable_dit=True, enable_proj=True)
"""Layers reserved for personas at start-up besides those of ``--lora`` ones: the reference's default targets."""


def open_registry(model: SpeechModel, config: ServerConfig) -> PersonaRegistry | None:
    """The personas of ``model`` with ``config.loras`` loaded (blocking: at startup, before the server reports
    ready, so a bad ``--lora`` stops it); None for a model without LoRA layers (the simulator)."""
    if not isinstance(model, VoxCPMSpeech):
        if config.loras:
            raise InvalidInputError(f"--lora needs a checkpoint model; {config.model!r} has no LoRA layers")
        return None
    registry = PersonaRegistry(model.tts, config)
    if config.loras or config.lora_root is not None:
        bank = model.tts.enable_personas(config.max_personas, config.max_lora_rank)
        bank.reserve(RESERVED_TARGETS)
        for name, path in config.loras:  # the operator's folders: not bound to ``lora_root``
            registry.load(name, Path(path))
        bank.seal()  # before the engine captures its graphs
    return registry


class PersonaRegistry:
    """Names → adapters of one model (blocking calls); the model's ``PersonaBank`` is made with the configured
    capacity. Its callers run one ``add`` at a time, so two loads of one name cannot both pass the checks."""

    def __init__(self, tts: VoxCPM, config: ServerConfig) -> None:
        self.tts = tts
        self.config = config

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
            modules = {key: tuple(getattr(lora, key)) for key in TARGET_KEYS}
            infos.append(PersonaInfo(name, adapter.source, adapter.rank, lora.alpha, *targets, users[name], modules))
        return infos

    def add(self, name: str, path: str) -> PersonaInfo:
        """Load the checkpoint folder ``path`` (on the server) as ``name`` (blocking: reads files, and briefly
        holds the engine's step lock)."""
        if self.tts.personas is None:
            raise PersonaLoadError(
                "personas_unavailable",
                "this server was started without personas: start it with --lora-root (or --lora) to add them",
            )
        if not is_persona_name(name):
            raise PersonaLoadError("invalid_name", "a persona name is 1-64 letters, digits or ._-")
        folder = self._folder(path)
        if name in self._bank_names():
            raise PersonaLoadError("persona_exists", f"persona {name!r} exists; delete it first")
        if len(self._bank_names()) >= self.config.max_loras:
            limit = self.config.max_loras
            raise PersonaLoadError("persona_limit", f"{limit} personas are loaded (max_loras); delete one first")
        self.load(name, folder)
        return next(info for info in self.infos() if info.name == name)

    def load(self, name: str, folder: Path) -> None:
        """Load the checkpoint ``folder`` as ``name``, unchecked (``add`` checks a client's request)."""
        self.tts.enable_personas(self.config.max_personas, self.config.max_lora_rank)
        try:
            self.tts.load_persona(name, folder)
        except ModelLoadError as exc:
            raise PersonaLoadError("invalid_lora", str(exc)) from exc
        except UnreservedLayersError as exc:
            raise PersonaLoadError("invalid_lora", f"{exc} (--lora)") from exc
        except PersonaError as exc:  # a rank above max_lora_rank
            raise PersonaLoadError("lora_too_large", str(exc)) from exc

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
        """The client's ``path`` as a folder on the server. Every refusal is ``invalid_path`` with the same kind
        of message whatever the file system said (a loop of links, a name too long, a folder not readable),
        so errors neither crash the handler nor tell a client more about the server's files than it sent."""
        if not path or "\0" in path:
            raise PersonaLoadError("invalid_path", "'path' must name a LoRA checkpoint folder on the server")
        root = self.config.lora_root
        try:
            folder = Path(path).expanduser().resolve()
            if root is not None and not folder.is_relative_to(root.expanduser().resolve()):
                raise PersonaLoadError("invalid_path", "'path' must be inside the server's LoRA root")
            if not folder.is_dir():
                raise PersonaLoadError("invalid_path", f"{path!r} is not a folder on the server")
        except (OSError, RuntimeError) as exc:  # RuntimeError: a loop of symbolic links before Python 3.13
            raise PersonaLoadError("invalid_path", f"{path!r} cannot be read as a folder on the server") from exc
        return folder


class LocalPersonas:
    """``Personas`` of the single-process server: its model's registry, loads off the event loop."""

    def __init__(self, registry: PersonaRegistry) -> None:
        self.registry = registry
        self._lock = asyncio.Lock()
        """Serializes adds, so two loads of one name cannot both pass the existence check."""

    def names(self) -> list[str]:
        return self.registry.names()

    def check(self, name: str | None) -> None:
        self.registry.check(name)

    async def infos(self) -> list[PersonaInfo]:
        return self.registry.infos()

    async def add(self, name: str, path: str) -> PersonaInfo:
        async with self._lock:
            return await asyncio.to_thread(self.registry.add, name, path)

    async def remove(self, name: str) -> None:
        self.registry.remove(name)
