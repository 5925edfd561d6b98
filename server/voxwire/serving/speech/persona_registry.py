"""LoRA personas on the model's side: ``PersonaRegistry`` over one model's bank (``voxwire.model.personas``),
``open_registry`` that sets it up at start-up, and ``LocalPersonas``, the single-process server's ``Personas``.

Personas are set up at start-up or not at all: with ``--lora`` or ``--lora-root`` the model's layers that
personas may adapt are reserved before the engine captures its graphs (``reserve``: the reference's default
targets, attention q/k/v/o of both LMs and the DiT plus the projections, and every layer a ``--lora`` persona
adapts), and from then on a persona is loaded by copying its weights into them. A persona adapting any other
layer is refused (``invalid_lora``); a server started with neither has no adapted layers (nothing slows its
steps). ``POST /v1/loras`` needs ``--lora-root`` (see ``serving.speech.persona_names`` for owners and what clients
read).

``PersonaRegistry`` is plain blocking code: the single-process server wraps it in ``LocalPersonas`` (loads on
a worker thread, never on the event loop); with ``--workers`` each engine process owns one, and the frontends
reach it over IPC (``workers.remote_personas.RemotePersonas``). Only processes that hold the model import this
module (it imports the model's code, hence torch); the handlers use ``serving.speech.persona_names``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from dataclasses import dataclass
from pathlib import Path

from voxwire.errors import InvalidInputError
from voxwire.model.lora import CKPT_FILE, CONFIG_FILE, SAFETENSORS_FILE, LoRAConfig, LoRALoadError, LoRATooLargeError
from voxwire.model.personas import PersonaError, PersonaInUseError, RankTooLargeError, UnreservedLayersError
from voxwire.serving.server_config import ServerConfig, is_persona_name
from voxwire.serving.speech.persona_names import (
    OPERATOR,
    TARGET_KEYS,
    PersonaInfo,
    PersonaLoadError,
    PersonaOwnerError,
    UnknownPersonaError,
)
from voxwire.speech_model import SpeechModel, VoxCPMSpeech
from voxwire.tts import VoxCPM

RESERVED_TARGETS = LoRAConfig(enable_lm=True, enable_dit=True, enable_proj=True)
"""Layers reserved for personas at start-up besides those of ``--lora`` ones: the reference's default targets."""
CHECKPOINT_FILES = (CONFIG_FILE, SAFETENSORS_FILE, CKPT_FILE)
"""The files of a checkpoint folder the loader reads: inside ``--lora-root`` each must resolve inside it too."""

logger = logging.getLogger(__name__)


def open_registry(model: SpeechModel, config: ServerConfig) -> PersonaRegistry | None:
    """The personas of ``model`` with ``config.personas.loras`` loaded (blocking: at startup, before the server reports
    ready, so a bad ``--lora`` stops it); None for a model without LoRA layers (the simulator)."""
    if not isinstance(model, VoxCPMSpeech):
        if config.personas.loras:
            raise InvalidInputError(f"--lora needs a checkpoint model; {config.engine.model!r} has no LoRA layers")
        return None
    registry = PersonaRegistry(model.tts, config)
    if config.personas.loras or config.personas.lora_root is not None:
        bank = model.tts.enable_personas(config.personas.max_personas, config.personas.max_lora_rank)
        bank.reserve(RESERVED_TARGETS)
        for name, path in config.personas.loras:  # the operator's folders: not bound to ``lora_root``
            registry.load(name, Path(path), OPERATOR, Path(path).name)
        bank.seal()  # before the engine captures its graphs
    return registry


@dataclass(frozen=True)
class _Record:
    """What the registry remembers of a persona besides its adapter."""

    owner: str | None
    """``OPERATOR``, the digest of the key that added it, or None (added without a key)."""
    listed_path: str
    """Its folder as listings show it (relative to ``--lora-root``, or the folder's name)."""


class PersonaRegistry:
    """Names → adapters of one model (blocking calls), with their owners; the model's ``PersonaBank`` is made with
    the configured capacity. Its callers run one ``add`` at a time, so two loads of one name cannot both pass the
    checks."""

    def __init__(self, tts: VoxCPM, config: ServerConfig) -> None:
        self.tts = tts
        self.config = config
        self._records: dict[str, _Record] = {}

    def _bank_names(self) -> list[str]:
        bank = self.tts.personas
        return [] if bank is None else list(bank.adapters)

    def _record(self, name: str) -> _Record:
        # An adapter registered on the model directly (not through this registry) counts as the operator's.
        return self._records.get(name) or _Record(OPERATOR, name)

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
            record = self._record(name)
            infos.append(
                PersonaInfo(
                    name, record.listed_path, adapter.rank, lora.alpha, *targets, users[name], modules, record.owner
                )
            )
        return infos

    def add(self, name: str, path: str, *, owner: str | None) -> PersonaInfo:
        """Load the checkpoint folder ``path`` (inside ``--lora-root``: absolute, or relative to it) as ``name``
        for ``owner`` (blocking: reads files, and briefly holds the engine's step lock). The cheap checks come
        first: the name, whether it is taken (or still held by requests), the limit; then the folder."""
        root = self.config.personas.lora_root
        bank = self.tts.personas
        if root is None or bank is None:
            raise PersonaLoadError(
                "personas_unavailable",
                "this server adds personas only from its LoRA folder: start it with --lora-root DIR to load "
                "folders inside DIR over the API (--lora NAME=DIR loads one at start-up)",
            )
        if not is_persona_name(name):
            raise PersonaLoadError("invalid_name", "a persona name is 1-64 letters, digits or ._-")
        if name in self._bank_names():
            raise PersonaLoadError("persona_exists", f"persona {name!r} exists; delete it first")
        if bank.users(name):
            raise PersonaLoadError(
                "persona_exists", f"persona {name!r} was deleted but requests still speak with it; retry when they end"
            )
        if len(self._bank_names()) >= self.config.personas.max_loras:
            limit = self.config.personas.max_loras
            raise PersonaLoadError("persona_limit", f"{limit} personas are loaded (max_loras); delete one first")
        folder, listed = self._folder(path, root)
        self.load(name, folder, owner, listed)
        return next(info for info in self.infos() if info.name == name)

    def load(self, name: str, folder: Path, owner: str | None, listed_path: str) -> None:
        """Load the checkpoint ``folder`` as ``name`` of ``owner``, listed as ``listed_path``, unchecked (``add``
        checks a client's request). Refusals say what is wrong without the folder's path or the files' contents;
        the log has every detail."""
        self.tts.enable_personas(self.config.personas.max_personas, self.config.personas.max_lora_rank)
        self._records[name] = _Record(owner, listed_path)  # before it can be listed or removed
        try:
            self._load(name, folder)
        except BaseException:
            del self._records[name]
            raise

    def _load(self, name: str, folder: Path) -> None:
        try:
            self.tts.load_persona(name, folder)
        except LoRATooLargeError as exc:
            raise self._refused(name, "lora_too_large", exc.public, exc) from None
        except LoRALoadError as exc:
            raise self._refused(name, "invalid_lora", exc.public, exc) from None
        except UnreservedLayersError as exc:
            raise PersonaLoadError("invalid_lora", f"{exc} (--lora)") from exc
        except PersonaInUseError as exc:
            raise PersonaLoadError("persona_exists", str(exc)) from exc
        except RankTooLargeError as exc:  # the bank's own check (``load_persona`` refuses such a rank first)
            raise PersonaLoadError("lora_too_large", str(exc)) from exc

    @staticmethod
    def _refused(name: str, code: str, public: str, exc: LoRALoadError) -> PersonaLoadError:
        logger.info("persona %r refused (%s): %s", name, code, exc)
        return PersonaLoadError(code, f"persona {name!r}: {public}")

    def remove(self, name: str, *, owner: str | None) -> None:
        """Forget ``name``: requests holding it finish with it, new ones get ``unknown_persona``. ``owner`` (the
        requester) may remove a persona it added, one added without a key, and, as ``OPERATOR``, any.

        Raises:
            UnknownPersonaError: no persona has this name.
            PersonaOwnerError: it is the operator's, or another key's."""
        bank = self.tts.personas
        if bank is None or name not in bank.adapters:
            raise UnknownPersonaError(f"unknown persona {name!r}")
        record = self._record(name)
        if owner != OPERATOR:
            if record.owner == OPERATOR:
                raise PersonaOwnerError(f"persona {name!r} is the operator's (--lora); it cannot be deleted here")
            if record.owner is not None and record.owner != owner:
                raise PersonaOwnerError(f"persona {name!r} was added with another API key; only that key may delete it")
        try:
            bank.remove(name)
        except PersonaError as exc:
            raise UnknownPersonaError(str(exc)) from None
        self._records.pop(name, None)

    @staticmethod
    def _folder(path: str, root: Path) -> tuple[Path, str]:
        """The client's ``path`` (absolute, or relative to ``root``) as a folder inside ``root``, and that folder
        relative to the root. The folder and the checkpoint files in it must resolve inside the root (a symbolic
        link out of it is refused). Every refusal is ``invalid_path`` with the same kind of message whatever the
        file system said (a loop of links, a name too long, a folder not readable), so errors neither crash the
        handler nor tell a client more about the server's files than it sent."""
        if not path or "\0" in path:
            raise PersonaLoadError("invalid_path", "'path' must name a LoRA checkpoint folder in the LoRA root")
        try:
            inside = root.expanduser().resolve()
            folder = (inside / path).resolve()  # an absolute ``path`` replaces the root
            if not folder.is_relative_to(inside):
                raise PersonaLoadError("invalid_path", f"{path!r} is not inside the server's LoRA root")
            if not folder.is_dir():
                raise PersonaLoadError("invalid_path", f"{path!r} is not a folder on the server")
            for file in CHECKPOINT_FILES:
                if not (folder / file).resolve().is_relative_to(inside):
                    raise PersonaLoadError("invalid_path", f"{path!r}: {file} links outside the server's LoRA root")
        except (OSError, RuntimeError) as exc:  # RuntimeError: a loop of symbolic links before Python 3.13
            raise PersonaLoadError("invalid_path", f"{path!r} cannot be read as a folder on the server") from exc
        return folder, folder.relative_to(inside).as_posix()


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

    async def add(self, name: str, path: str, *, owner: str | None) -> PersonaInfo:
        async with self._lock:
            return await asyncio.to_thread(functools.partial(self.registry.add, name, path, owner=owner))

    async def remove(self, name: str, *, owner: str | None) -> None:
        self.registry.remove(name, owner=owner)
