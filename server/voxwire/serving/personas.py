"""LoRA personas as the server sees them: ``PersonaRegistry`` over one model's bank (``voxwire.model.personas``),
and ``Personas``, what the handlers use.

Every transport checks a persona's name before it starts work, and again where a removal may have raced the
request (the persona rule, stated once at ``check_persona``: an unknown name is an ``UnknownPersonaError``, the
same ``unknown_persona`` code on the WebSocket, the OpenAI endpoint and the ``/v1/loras`` API). Removing a
persona lets the requests already holding it finish; new ones are refused.

Personas are set up at start-up or not at all: with ``--lora`` or ``--lora-root`` the model's layers that
personas may adapt are reserved before the engine captures its graphs (``reserve``: the reference's default
targets, attention q/k/v/o of both LMs and the DiT plus the projections, and every layer a ``--lora`` persona
adapts), and from then on a persona is loaded by copying its weights into them. A persona adapting any other
layer is refused (``invalid_lora``); a server started with neither has no adapted layers (nothing slows its
steps).

Clients add personas (``POST /v1/loras``) only from folders inside ``--lora-root``: without it the request is
refused (``personas_unavailable``), and a folder, or a file the loader reads, that resolves outside the root
(a symbolic link) is ``invalid_path``. Owners, as for voices: a persona added with an API key records a digest of
the key (never listed) and only that key may remove it; one added without a key (authentication off) anyone
may remove; ``--lora`` personas belong to the operator (``OPERATOR``) and no client removes them
(``PersonaOwnerError``, 403 ``forbidden``). What clients read carries no server path and no file contents:
errors say what is wrong in the format's terms (``LoRALoadError.public``; the log keeps the full detail), and
listings name a persona's folder relative to the root (an operator's: its folder's name).

``PersonaRegistry`` is plain blocking code: the single-process server wraps it in ``LocalPersonas`` (loads on
a worker thread, never on the event loop); with ``--workers`` each engine process owns one, and the frontends
reach it over IPC (``workers.remote_personas.RemotePersonas``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Protocol

from voxwire.errors import InvalidInputError, VoxwireError
from voxwire.model.lora import CKPT_FILE, CONFIG_FILE, SAFETENSORS_FILE, LoRAConfig, LoRALoadError, LoRATooLargeError
from voxwire.model.personas import PersonaError, PersonaInUseError, RankTooLargeError, UnreservedLayersError
from voxwire.serving.config import ServerConfig, is_persona_name
from voxwire.speech_model import SpeechModel, VoxCPMSpeech
from voxwire.tts import VoxCPM

TARGET_KEYS = ("target_modules_lm", "target_modules_dit", "target_proj_modules")
"""The reference config's keys of the modules an adapter targets."""
RESERVED_TARGETS = LoRAConfig(enable_lm=True, enable_dit=True, enable_proj=True)
"""Layers reserved for personas at start-up besides those of ``--lora`` ones: the reference's default targets."""
OPERATOR: Final = "operator"
"""The owner of ``--lora`` personas, and who may remove any persona (the server itself, never a client: a key's
digest is 32 hex digits, a request without a key has None)."""
CHECKPOINT_FILES = (CONFIG_FILE, SAFETENSORS_FILE, CKPT_FILE)
"""The files of a checkpoint folder the loader reads: inside ``--lora-root`` each must resolve inside it too."""

logger = logging.getLogger(__name__)


class UnknownPersonaError(VoxwireError):
    """No persona has this name (never loaded, or removed)."""


class PersonaOwnerError(VoxwireError):
    """The persona is the operator's (``--lora``) or was added with another API key: this requester may not remove
    it."""


class PersonaLoadError(VoxwireError):
    """A persona could not be added; ``code`` is stable (``invalid_name``, ``invalid_path``,
    ``persona_exists``, ``persona_limit``, ``invalid_lora``, ``lora_too_large``, ``personas_unavailable``)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code

    def __reduce__(self) -> tuple[type[PersonaLoadError], tuple[str, str]]:
        # It crosses the engine-frontend IPC pickled; the default would rebuild it from ``args`` alone.
        return type(self), (self.code, str(self))


@dataclass(frozen=True)
class PersonaInfo:
    """A registered persona, as ``GET /v1/loras`` lists it."""

    name: str
    path: str
    """Its folder relative to ``--lora-root`` (an operator's ``--lora`` persona: the folder's name only)."""
    rank: int
    alpha: float
    lm: bool
    dit: bool
    projections: bool
    in_use: int
    """Requests holding it now."""
    modules: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """The modules it adapts, by the reference config's keys (``TARGET_KEYS``)."""
    owner: str | None = None
    """Who may remove it (``PersonaRegistry.remove``); not listed. A restarted engine gets it with the persona."""

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name, "object": "lora", "path": self.path, "rank": self.rank, "alpha": self.alpha,
            "targets": {"lm": self.lm, "dit": self.dit, "projections": self.projections}, "in_use": self.in_use,
        }  # fmt: skip


def persona_targets(infos: Iterable[PersonaInfo]) -> dict[str, list[str]]:
    """The modules any of ``infos`` adapts, by the reference config's keys (Nano-vLLM-VoxCPM's ``GET /info``)."""
    infos = list(infos)
    return {key: sorted({module for info in infos for module in info.modules.get(key, ())}) for key in TARGET_KEYS}


class Personas(Protocol):
    """The personas requests may name, as the handlers use them (``LocalPersonas``, ``RemotePersonas``)."""

    def names(self) -> list[str]: ...

    def check(self, name: str | None) -> None:
        """Raise ``UnknownPersonaError`` unless ``name`` is None (the base model) or a registered persona."""
        ...

    async def infos(self) -> list[PersonaInfo]: ...

    async def add(self, name: str, path: str, *, owner: str | None) -> PersonaInfo:
        """Load the checkpoint folder ``path`` (inside ``--lora-root``) as ``name`` for ``owner`` (the requester's
        key digest, None without a key); ``PersonaLoadError`` if it cannot."""
        ...

    async def remove(self, name: str, *, owner: str | None) -> None:
        """Forget ``name``: requests holding it finish with it, new ones get ``unknown_persona``.
        ``PersonaOwnerError`` unless ``owner`` may (``PersonaRegistry.remove``)."""
        ...


def check_persona(personas: Personas | PersonaRegistry | None, persona: str | None) -> None:
    """Raise ``UnknownPersonaError`` unless ``persona`` is None (the base model) or loaded in ``personas``.

    **The persona rule.** Personas are added and removed while requests are on their way, so a persona is
    checked by name wherever a request naming it meets a registry that may have changed since the last check,
    each time with this function (``unknown_persona`` on every transport):

    1. before any work starts: a WebSocket ``start`` (``ws.utterance.resolve_settings``) and an HTTP request, so the
       client hears of an unknown name at once, not at its first sentence;
    2. for each engine request (``service.speech_stream``, every ``Service.speak``): an utterance is one request
       per sentence, and a persona removed after ``start`` refuses the sentences that follow instead of their
       being spoken by the base model;
    3. when a request reaches an engine process (``workers.engine_process``, ``--workers``): its frontend checked
       the names engine 0 last announced, and a removal may reach this engine first; the registry here decides.

    A persona removed after the last check, while its request waits in the engine's queue, fails that request at
    prefill (the runner cannot acquire it: ``synthesis_failed``). A request already holding a persona finishes
    with it."""
    if persona is None:
        return
    if personas is None:
        raise UnknownPersonaError(f"unknown persona {persona!r}: this server has no personas")
    personas.check(persona)


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
        root = self.config.lora_root
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
        if len(self._bank_names()) >= self.config.max_loras:
            limit = self.config.max_loras
            raise PersonaLoadError("persona_limit", f"{limit} personas are loaded (max_loras); delete one first")
        folder, listed = self._folder(path, root)
        self.load(name, folder, owner, listed)
        return next(info for info in self.infos() if info.name == name)

    def load(self, name: str, folder: Path, owner: str | None, listed_path: str) -> None:
        """Load the checkpoint ``folder`` as ``name`` of ``owner``, listed as ``listed_path``, unchecked (``add``
        checks a client's request). Refusals say what is wrong without the folder's path or the files' contents;
        the log has every detail."""
        self.tts.enable_personas(self.config.max_personas, self.config.max_lora_rank)
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
