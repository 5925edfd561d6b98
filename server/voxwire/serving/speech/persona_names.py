"""LoRA personas as the handlers see them: ``Personas``, the names requests may use, their errors and their
listing (``PersonaInfo``). No model code: a ``--workers`` frontend checks names and relays calls without torch.
The model's side, ``PersonaRegistry`` over one model's bank, is ``serving.speech.persona_registry``.

Every transport checks a persona's name before it starts work, and again where a removal may have raced the
request (the persona rule, stated once at ``check_persona``: an unknown name is an ``UnknownPersonaError``, the
same ``unknown_persona`` code on the WebSocket, the OpenAI endpoint and the ``/v1/loras`` API). Removing a
persona lets the requests already holding it finish; new ones are refused.

Clients add personas (``POST /v1/loras``) only from folders inside ``--lora-root``: without it the request is
refused (``personas_unavailable``), and a folder, or a file the loader reads, that resolves outside the root
(a symbolic link) is ``invalid_path``. Owners, as for voices: a persona added with an API key records a digest of
the key (never listed) and only that key may remove it; one added without a key (authentication off) anyone
may remove; ``--lora`` personas belong to the operator (``OPERATOR``) and no client removes them
(``PersonaOwnerError``, 403 ``forbidden``). What clients read carries no server path and no file contents:
errors say what is wrong in the format's terms (``LoRALoadError.public``; the log keeps the full detail), and
listings name a persona's folder relative to the root (an operator's: its folder's name).

Persona slots are shared fairly (``client_owner``): a request counts against its API key, or without
authentication against its connection, and one owner's running requests hold at most ``--persona-slots-per-client``
of the device's persona slots; a request over it, or finding every slot held, waits in the engine's queue
(``engine.scheduler``, rules P1-P4) and after ``--max-persona-wait-s`` is refused ``busy`` (503, ``Retry-After``).

The single-process server's ``Personas`` are ``persona_registry.LocalPersonas``; with ``--workers`` each engine
process owns a registry, and the frontends reach it over IPC (``workers.remote_personas.RemotePersonas``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final, Protocol

from voxwire.errors import VoxwireError

TARGET_KEYS = ("target_modules_lm", "target_modules_dit", "target_proj_modules")
"""The reference config's keys of the modules an adapter targets."""
OPERATOR: Final = "operator"
"""The owner of ``--lora`` personas, and who may remove any persona (the server itself, never a client: a key's
digest is 32 hex digits, a request without a key has None)."""


def client_owner(key_owner: str | None, connection: object) -> str:
    """Who a request's persona slots count against: its API key's digest (``OWNER_KEY``), or without one its
    connection (``connection``: this process's object for it; the process id keeps frontends apart)."""
    return f"key:{key_owner}" if key_owner is not None else f"connection:{os.getpid()}:{id(connection)}"


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


class PersonaCheck(Protocol):
    """What checks a request's persona: the handlers' ``Personas``, or an engine process's ``PersonaRegistry``."""

    def check(self, name: str | None) -> None:
        """Raise ``UnknownPersonaError`` unless ``name`` is None (the base model) or a registered persona."""
        ...


def check_persona(personas: PersonaCheck | None, persona: str | None) -> None:
    """Raise ``UnknownPersonaError`` unless ``persona`` is None (the base model) or loaded in ``personas``.

    **The persona rule.** Personas are added and removed while requests are on their way, so a persona is
    checked by name wherever a request naming it meets a registry that may have changed since the last check,
    each time with this function (``unknown_persona`` on every transport):

    1. before any work starts: a WebSocket ``start`` (``ws.utterance.resolve_settings``) and an HTTP request, so the
       client hears of an unknown name at once, not at its first sentence;
    2. for each engine request (``service.EngineSpeaker.speak``, every topology's): an utterance is one request
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
